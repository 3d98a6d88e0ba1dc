"""A data root that cannot be written (a cluster's read-only dataset mount): data.cache_root takes
everything a run computes from the data, and a cache that cannot be written is one line naming the
setting. A split file without a test split (held out) trains and is said once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from captioning.cli import main
from captioning.config import load_config
from captioning.data.records import held_out_note
from tests.tiny import TINY


def _files(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.fixture
def data_copy(shapes_root: Path, tmp_path: Path) -> Path:
    """The session's shapes images and split file, without the caches made beside them."""
    root = tmp_path / "data"
    shutil.copytree(shapes_root / "images", root / "images")
    shutil.copy(shapes_root / "dataset_shapes.json", root / "dataset_shapes.json")
    return root


@pytest.fixture(autouse=True)
def _quiet_restored(monkeypatch):
    """--quiet sets CAPTIONING_QUIET in the environment (for the processes a run starts): restored after."""
    monkeypatch.setenv("CAPTIONING_QUIET", "0")


def test_cache_root_takes_the_caches_and_the_data_root_is_left_as_it_was(data_copy: Path, tmp_path: Path) -> None:
    before = _files(data_copy)
    cache = tmp_path / "cache"
    code = main(["prepare-features", "--quiet", f"data.root={data_copy}", f"data.cache_root={cache}", *TINY,
                 f"train.out_dir={tmp_path / 'run'}", "--splits", "val"])
    assert code == 0
    assert _files(data_copy) == before  # not a lock file, not a token written under the data
    assert [path.name for path in (cache / "features").iterdir()] == [
        path.name for path in (cache / "features").iterdir() if path.name.startswith("efficientnet_lite0-stride16-96")]
    assert (next((cache / "features").iterdir()) / "val.npy").is_file()


def test_a_cache_that_cannot_be_written_is_one_line_naming_the_setting(data_copy: Path, tmp_path: Path,
                                                                      capsys) -> None:
    """As under a read-only mount (the tests may run as root, whom permissions do not stop): the
    cache's folder cannot be made, since a file stands where its parent would be."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a folder")
    code = main(["prepare-features", "--quiet", f"data.root={data_copy}", f"data.cache_root={blocked}", *TINY,
                 f"train.out_dir={tmp_path / 'run'}", "--splits", "val"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"error: {blocked / 'features'}") and "set data.cache_root" in err[0]


def test_a_split_file_without_a_test_split_is_said_once_and_trains(data_copy: Path, tmp_path: Path,
                                                                  capsys) -> None:
    split_file = data_copy / "dataset_shapes.json"
    entries = json.loads(split_file.read_text())
    entries["images"] = [entry for entry in entries["images"] if entry["split"] != "test"]
    split_file.write_text(json.dumps(entries))
    config = load_config(None, [f"data.root={data_copy}", *TINY])
    note = held_out_note(config.data)
    assert note is not None and "no test split" in note and "eval.py --split val" in note
    assert held_out_note(load_config(None, [f"data.root={tmp_path / 'none'}"]).data) is not None  # any reason named
    common = [f"data.root={data_copy}", f"data.cache_root={tmp_path / 'cache'}", *TINY,
              f"train.out_dir={tmp_path / 'run'}"]
    assert main(["prepare-features", "--quiet", *common]) == 0  # every split there is: train and val
    out, err = capsys.readouterr()
    assert [line for line in err.splitlines() if "no test split" in line] == [note]
    assert [line.split(":")[0] for line in out.splitlines()] == ["train", "val", "cache"]
    code = main(["train", "--quiet", *common, "train.max_steps=2"])
    err = capsys.readouterr().err
    assert code == 0
    assert [line for line in err.splitlines() if "no test split" in line] == [note]
    assert (tmp_path / "run" / "best.pt").is_file()


def test_a_split_file_with_a_test_split_says_nothing(shapes_root: Path) -> None:
    assert held_out_note(load_config(None, [f"data.root={shapes_root}", *TINY]).data) is None
