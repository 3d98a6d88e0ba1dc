"""The feature cache knows each row's image by its contents (data/features.py): a dataset copied or
moved with its cache is not encoded again, an image replaced under its own name is; where the cache
cannot be written, the changed rows are encoded in memory for the run and the file is left as it was.
(The same with real rights, through the commands: tests/test_read_only_data.py.)"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from captioning.data import features
from captioning.data.features import load_or_compute
from captioning.data.formats.karpathy import read_split


def _never():
    raise AssertionError("nothing should be encoded")


def _dataset(shapes_root: Path, root: Path) -> list:
    """The val split's images copied under root (a dataset of its own that the test may change)."""
    (root / "images").mkdir(parents=True)
    records = read_split(shapes_root / "dataset_shapes.json", "val")
    for record in records:
        shutil.copy2(record.path, root / "images" / record.path.name)
    return _moved(records, root)


def _moved(records: list, root: Path) -> list:
    return [dataclasses.replace(record, path=root / "images" / record.path.name) for record in records]


def test_a_dataset_copied_with_its_cache_is_not_encoded_again_but_a_replaced_image_is(
        shapes_root: Path, encoder, tmp_path: Path, capsys) -> None:
    records = _dataset(shapes_root, tmp_path / "one")
    first = np.array(load_or_compute(tmp_path / "one" / "features", "val", records, encoder_factory=lambda: encoder,
                                     image_size=96).annotations)
    shutil.copytree(tmp_path / "one", tmp_path / "two")  # cp -a: the times kept, every path another
    copied = _moved(records, tmp_path / "two")
    capsys.readouterr()
    again = load_or_compute(tmp_path / "two" / "features", "val", copied, encoder_factory=_never, image_size=96)
    assert np.array_equal(np.array(again.annotations), first) and capsys.readouterr().err == ""
    replaced = copied[1].path
    replaced.write_bytes(copied[4].path.read_bytes())  # another picture under the same name
    refreshed = load_or_compute(tmp_path / "two" / "features", "val", copied, encoder_factory=lambda: encoder,
                                image_size=96)
    assert f"1 image changed since the cache was made ({replaced}), encoded again" in capsys.readouterr().err
    assert np.array_equal(np.array(refreshed.annotations)[1], first[4])
    assert refreshed.contents[1] == refreshed.contents[4] != again.contents[1]


def test_a_cache_that_cannot_be_written_is_refreshed_in_memory_and_left_as_it_was(
        shapes_root: Path, encoder, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    records = _dataset(shapes_root, tmp_path)
    directory = tmp_path / "features"
    first = np.array(load_or_compute(directory, "val", records, encoder_factory=lambda: encoder,
                                     image_size=96).annotations)
    files = {path.name: path.read_bytes() for path in directory.iterdir()}
    records[2].path.write_bytes(records[5].path.read_bytes())

    def read_only(directory: Path) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(features, "_check_writable", read_only)
    capsys.readouterr()
    for _ in range(2):  # at each run, since nothing can be kept
        cached = load_or_compute(directory, "val", records, encoder_factory=lambda: encoder, image_size=96)
        err = capsys.readouterr().err
        assert f"note: {directory}: the cache cannot be updated there (Permission denied): 1 changed image " \
               "encoded again in memory, at each run" in err
        annotations = np.array(cached.annotations)
        assert np.array_equal(annotations[2], first[5])
        assert np.array_equal(np.delete(annotations, 2, axis=0), np.delete(first, 2, axis=0))
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == files
