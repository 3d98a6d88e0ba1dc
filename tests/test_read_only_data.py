"""Read-only, shared and moved data through the commands, run as a user without write rights
(tests/rights.py): each refusal is one line on stderr and a non-zero exit, never a traceback, and
nothing is lost (the caches and checkpoints as they were, the other inputs processed)."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from PIL import Image

from captioning.config import load_config
from captioning.data.splits import features_dir
from tests.rights import as_another_user, read_only, without_write_rights, writable_again
from tests.tiny import REPO, TINY

pytestmark = pytest.mark.slow  # a command a test: about 5 s each

PYTHON = sys.executable
CLI = [PYTHON, "-m", "captioning.cli"]
FOLDER_CONFIG = REPO / "configs" / "folder_soft.yaml"


def _fingerprint(*roots: Path) -> dict[str, str]:
    """Every file under `roots` with the digest of its bytes: what "nothing lost" compares."""
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for root in roots
            for path in sorted(root.rglob("*")) if path.is_file() and not path.name.endswith(".lock")}


def _refused_in_one_line(done, *, code: int = 2) -> str:
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    return errors[0]


@pytest.fixture
def copies(tiny_run, tmp_path: Path):
    """The tiny run's shapes data copied as `cp -a` copies (every path another, the times kept), its
    feature caches with it; writable again after the test so that pytest can remove it."""
    made = []

    def copy(name: str, *, caches: bool = True) -> Path:
        target = tmp_path / name
        ignore = None if caches else shutil.ignore_patterns("features", "tokens")
        shutil.copytree(tiny_run.data_root, target, ignore=ignore)
        made.append(target)
        return target

    yield copy
    writable_again(*made)


def _val_images(root: Path) -> list[Path]:
    return sorted((root / "images" / "val").iterdir())


def test_a_read_only_copy_whose_cache_must_be_refreshed_is_evaluated_and_verified(tiny_run, copies) -> None:
    copy = copies("moved")
    for image, other in zip(_val_images(copy), sorted((copy / "images" / "train").iterdir())):
        image.write_bytes(other.read_bytes())  # other pictures under the same names
    read_only(copy)
    kept = _fingerprint(copy, tiny_run.run_dir)
    done = without_write_rights([PYTHON, "eval.py", "--checkpoint", str(tiny_run.checkpoint), "--split", "val",
                                 f"data.root={copy}"])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "8 changed images encoded again in memory, at each run" in done.stderr
    assert "Bleu_4" in done.stdout
    done = without_write_rights([*CLI, "verify", str(tiny_run.checkpoint), f"data.root={copy}"])
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "  data differs from the record: val_image_contents: 8 images changed (images/val/" in done.stdout
    assert "hardware" not in done.stdout
    assert _fingerprint(copy, tiny_run.run_dir) == kept


def test_a_damaged_cache_on_a_read_only_root_is_one_line_and_stays_as_it_was(tiny_run, copies) -> None:
    copy = copies("damaged")
    array = features_dir(load_config(None, [f"data.root={copy}", *TINY])) / "val.npy"  # the tiny run's cache
    damaged = bytearray(array.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    array.write_bytes(bytes(damaged))
    read_only(copy)
    kept = _fingerprint(copy)
    done = without_write_rights([PYTHON, "eval.py", "--checkpoint", str(tiny_run.checkpoint), "--split", "val",
                                 f"data.root={copy}"])
    line = _refused_in_one_line(done)
    assert line.startswith(f"error: {array}: damaged, block 0 of 1 does not match its checksum; it cannot be "
                           "removed to be rebuilt there (Permission denied): set data.cache_root")
    assert _fingerprint(copy) == kept


def test_read_only_data_without_caches_is_one_line_until_a_cache_root_is_given(tiny_run, copies,
                                                                               tmp_path: Path) -> None:
    copy = copies("bare", caches=False)
    read_only(copy)
    kept = _fingerprint(copy)
    done = without_write_rights([*CLI, "prepare-features", f"data.root={copy}", *TINY, "--splits", "val"])
    assert "cannot be written there" in _refused_in_one_line(done) and "data.cache_root" in done.stderr
    mine, run = tmp_path / "cache", tmp_path / "run"
    # the caches another copy of these images made, in the cache root: known by the images' contents,
    # they are not encoded again (which would take the test most of its time)
    shutil.copytree(tiny_run.data_root / "features", mine / "features")
    done = without_write_rights([PYTHON, "train.py", f"data.root={copy}", f"data.cache_root={mine}", *TINY,
                                 f"train.out_dir={run}", "train.max_steps=2", "train.val_images=4"])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (run / "best.pt").is_file()
    # the cache this run read, the one written last: other tests may have cached other encoders or
    # paddings of the same images beside it, which this run did not touch
    written = max(mine.glob("features/*/train.json"), key=lambda path: path.stat().st_mtime_ns)
    cached = json.loads(written.read_text())
    assert cached["paths"] and all(path.startswith(str(copy)) for path in cached["paths"])  # now this data's
    assert _fingerprint(copy) == kept


def test_the_embedded_default_on_a_read_only_root_without_its_data_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    read_only(empty)
    try:
        for cache in ([], [f"data.cache_root={tmp_path / 'cache'}"]):
            done = without_write_rights([PYTHON, "train.py", f"data.root={empty}", *cache,
                                         f"train.out_dir={tmp_path / 'run'}"])
            assert _refused_in_one_line(done) == (
                f"error: {empty}: the shapes data is not there and cannot be made there (Permission denied); make "
                "it where you can write, `captioning make-shapes --out DIR`, and set data.root=DIR")
    finally:
        writable_again(empty)


def test_caption_names_each_bad_input_and_captions_the_others(tiny_run, copies, tmp_path: Path) -> None:
    copy = copies("photos", caches=False)
    images = _val_images(copy)
    images[1].chmod(0o000)  # another user's photo, which this user may not read
    (copy / "empty").mkdir()
    read_only(copy)
    done = without_write_rights([*CLI, "caption", str(images[0]), str(images[1]), str(copy / "empty"),
                                 str(images[2]), "--checkpoint", str(tiny_run.checkpoint), "--quiet"])
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert [line.split("\t")[0] for line in done.stdout.splitlines()] == [str(images[0]), str(images[2])]
    assert sorted(errors) == sorted([f"error: {copy / 'empty'}: no images in this folder (files named *.jpg, *.jpeg, "
                                     "*.png, *.gif, *.bmp, *.tif, *.tiff, *.webp, *.ppm, *.pgm)",
                                     f"error: {images[1]}: permission denied"])


def _folder(root: Path, count: int) -> None:
    (root / "images").mkdir(parents=True)
    with (root / "captions.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["image", "caption"])
        for index in range(count):
            Image.new("RGB", (8, 8), (index * 9 % 256, 40, 90)).save(root / "images" / f"p{index:02d}.png")
            writer.writerow([f"p{index:02d}.png", f"a photo of thing {index % 3}"])


def test_a_shared_folder_that_grew_is_one_line_then_keeps_its_owners_splits_in_a_cache_root_of_ones_own(
        tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    _folder(shared, 24)
    owner = without_write_rights([*CLI, "prepare", "--config", str(FOLDER_CONFIG), f"data.root={shared}",
                                  f"train.out_dir={tmp_path / 'owners'}", "data.folder.split_share=0.2"])
    assert owner.returncode == 0, owner.stderr
    record = next((shared / "splits").iterdir())
    splits = {row[0]: row[1] for row in csv.reader(record.open())}
    Image.new("RGB", (8, 8), (1, 2, 3)).save(shared / "images" / "new.png")  # the owner adds a photo
    with (shared / "captions.csv").open("a", newline="") as file:
        csv.writer(file).writerow(["new.png", "a new photo"])
    kept = _fingerprint(shared)
    mine = tmp_path / "mine"
    command = [*CLI, "prepare", "--config", str(FOLDER_CONFIG), f"data.root={shared}", "data.folder.split_share=0.2",
               f"train.out_dir={mine / 'run'}"]
    done = as_another_user(command, owner_of=[shared], writable=[mine])
    assert _refused_in_one_line(done).startswith(f"error: {shared / 'splits'}: cannot write the splits record there")
    done = as_another_user([*command, f"data.cache_root={mine / 'cache'}"], owner_of=[shared], writable=[mine])
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"24 images of this data found in the splits record {record}" in done.stdout
    written = {row[0]: row[1] for row in csv.reader((mine / "run" / "splits.csv").open())}
    assert {image: written[image] for image in splits if image != "image"} == {
        image: split for image, split in splits.items() if image != "image"}
    assert _fingerprint(shared) == kept
