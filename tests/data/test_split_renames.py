"""A photo's split follows its contents, under whatever name (data/kept_splits.py): names swapped,
photos renumbered after one is deleted, the same bytes under two names, a photo edited under its
name, and two files whose size and time say nothing of which is which. Each is driven through
`captioning prepare` on a collection made as a user makes one (`captioning make-shapes --folder`),
and each checks every photo's split by its bytes, not by its name."""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from captioning.cli import main
from captioning.data.formats import folder
from captioning.data.formats.folder import read_collection
from captioning.data.kept_splits import COLUMNS
from captioning.data.shapes.scenes import write_folder
from tests.tiny import REPO

CONFIG = REPO / "configs" / "folder_soft.yaml"


def _collection(root: Path, count: int = 40) -> list[str]:
    write_folder(root, count, seed=5, image_size=48)
    return sorted(path.name for path in (root / "images").iterdir())


def _prepare(root: Path, capsys: pytest.CaptureFixture[str], *, code: int = 0) -> list[str]:
    """`captioning prepare` on the folder: its printed lines (stdout, or stderr where it fails). Each
    command is a process of its own: the collection read by the last one in this process is let go."""
    folder._cached.cache_clear()
    done = main(["prepare", "--config", str(CONFIG), f"data.root={root}", f"train.out_dir={root / 'run'}",
                 "data.folder.split_share=0.15"])
    printed = capsys.readouterr()
    assert done == code, printed.err
    return (printed.out if code == 0 else printed.err).splitlines()


def _splits_by_contents(root: Path) -> dict[str, set[str]]:
    """Each photo's bytes (their digest) -> the splits the run's copy of the splits puts them in."""
    with (root / "run" / "splits.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    placed: dict[str, set[str]] = {}
    for row in rows:
        digest = hashlib.sha256((root / "images" / row["image"]).read_bytes()).hexdigest()
        placed.setdefault(digest, set()).add(row["split"])
    return placed


def _rename(root: Path, renames: dict[str, str]) -> None:
    """Photos renamed (all at once, so that names may swap), and their caption rows with them."""
    images = root / "images"
    for old in renames:
        (images / old).rename(images / f"{old}.moving")
    for old, new in renames.items():
        (images / f"{old}.moving").rename(images / new)
    with (root / "captions.csv").open(newline="") as file:
        rows = list(csv.reader(file))
    with (root / "captions.csv").open("w", newline="") as file:
        csv.writer(file).writerows([rows[0], *([renames.get(row[0], row[0]), *row[1:]] for row in rows[1:])])


def _held_out(root: Path) -> dict[str, str]:
    with (root / "run" / "splits.csv").open(newline="") as file:
        return {row["image"]: row["split"] for row in csv.DictReader(file)}


def test_a_test_photo_and_a_train_photo_swapping_names_keep_their_splits(tmp_path: Path, capsys) -> None:
    _collection(tmp_path)
    _prepare(tmp_path, capsys)
    before, splits = _splits_by_contents(tmp_path), _held_out(tmp_path)
    tested = next(name for name, split in splits.items() if split == "test")
    trained = next(name for name, split in splits.items() if split == "train")
    _rename(tmp_path, {tested: trained, trained: tested})
    printed = _prepare(tmp_path, capsys)
    assert _splits_by_contents(tmp_path) == before
    assert (_held_out(tmp_path)[tested], _held_out(tmp_path)[trained]) == ("train", "test")
    said = next(line for line in printed if line.startswith("2 images moved, renamed or copied since the splits "
                                                            "record placed them keep their split, known by their"))
    assert f"{tested} (was {trained})" in said and f"{trained} (was {tested})" in said
    _prepare(tmp_path, capsys)  # written down: the next read finds each by its name
    assert _splits_by_contents(tmp_path) == before


def test_photos_renumbered_after_one_is_deleted_keep_their_splits(tmp_path: Path, capsys) -> None:
    names = _collection(tmp_path)
    _prepare(tmp_path, capsys)
    before = _splits_by_contents(tmp_path)
    deleted = names[3]
    gone = hashlib.sha256((tmp_path / "images" / deleted).read_bytes()).hexdigest()
    (tmp_path / "images" / deleted).unlink()
    with (tmp_path / "captions.csv").open(newline="") as file:
        rows = [row for row in csv.reader(file) if row[0] != deleted]
    (tmp_path / "captions.csv").write_text("".join(",".join(row) + "\n" for row in rows))
    _rename(tmp_path, {old: new for new, old in zip(names[3:], names[4:])})  # the usual tidy-up: no gap
    printed = _prepare(tmp_path, capsys)
    assert _splits_by_contents(tmp_path) == {digest: splits for digest, splits in before.items() if digest != gone}
    assert any(line.startswith("36 images moved, renamed or copied since the splits record placed them")
               for line in printed)


def test_the_same_bytes_under_two_names_share_one_split_and_prepare_counts_them(tmp_path: Path, capsys) -> None:
    names = _collection(tmp_path)
    for name in names:  # every photo again, under a second name, with its captions
        shutil.copy(tmp_path / "images" / name, tmp_path / "images" / f"dup_{name}")
    with (tmp_path / "captions.csv").open(newline="") as file:
        rows = list(csv.reader(file))
    with (tmp_path / "captions.csv").open("a", newline="") as file:
        csv.writer(file).writerows([f"dup_{row[0]}", row[1]] for row in rows[1:])
    printed = _prepare(tmp_path, capsys)
    placed = _splits_by_contents(tmp_path)
    assert len(placed) == 40 and all(len(splits) == 1 for splits in placed.values())
    assert {"val", "test"} <= set.union(*placed.values())
    assert any(line.startswith("40 images repeat the contents of another under another name, and share its split "
                               f"(dup_{names[0]} = {names[0]}, ") for line in printed)


def test_copies_an_older_record_placed_apart_are_brought_together_in_train_and_said(tmp_path: Path,
                                                                                      capsys) -> None:
    names = _collection(tmp_path)
    _prepare(tmp_path, capsys)
    splits = _held_out(tmp_path)
    tested = next(name for name in names if splits[name] == "test")
    trained = next(name for name in names if splits[name] == "train")
    shutil.copy(tmp_path / "images" / trained, tmp_path / "images" / "copy.jpg")
    record = next((tmp_path / "splits").iterdir())
    with record.open(newline="") as file:  # as the code before copies were known placed one: in test
        rows = list(csv.reader(file))
    digest = next(row[3] for row in rows if row[0] == trained)
    rows.append(["copy.jpg", "test", "", digest, "", ""])
    with record.open("w", newline="") as file:
        csv.writer(file).writerows(rows)
    with (tmp_path / "captions.csv").open("a", newline="") as file:
        csv.writer(file).writerow(["copy.jpg", "a photo"])
    printed = _prepare(tmp_path, capsys)
    assert _held_out(tmp_path)["copy.jpg"] == _held_out(tmp_path)[trained] == "train"
    assert _held_out(tmp_path)[tested] == "test"
    assert any(line.startswith("1 image the splits record kept apart from a copy of theirs now share its split "
                               "(copy.jpg: test -> train); scores taken on the older splits held photos trained on")
               for line in printed)


def test_rows_that_give_the_same_bytes_two_splits_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    names = _collection(tmp_path, count=10)
    shutil.copy(tmp_path / "images" / names[0], tmp_path / "images" / "again.jpg")
    with (tmp_path / "captions.csv").open(newline="") as file:
        rows = list(csv.reader(file))
    with (tmp_path / "captions.csv").open("w", newline="") as file:
        csv.writer(file).writerows([[*rows[0], "split"], *([*row, "train" if row[0] == names[0] else ""]
                                                           for row in rows[1:]), ["again.jpg", "a photo", "test"]])
    printed = _prepare(tmp_path, capsys, code=2)
    assert printed == [f"error: {tmp_path / 'captions.csv'}: 1 photo under several names with the same contents "
                       f"given two splits by their rows ({names[0]}: train, again.jpg: test); a copy of a photo "
                       "shares its split: give them one"]
    assert not (tmp_path / "splits").exists()


def test_a_photo_edited_under_its_name_keeps_its_split_and_prepare_says_so(tmp_path: Path, capsys) -> None:
    _collection(tmp_path)
    _prepare(tmp_path, capsys)
    splits = _held_out(tmp_path)
    tested = next(name for name, split in splits.items() if split == "test")
    with Image.open(tmp_path / "images" / tested) as photo:
        photo.resize((24, 24)).save(tmp_path / "images" / tested)  # resized: bytes no image had
    printed = _prepare(tmp_path, capsys)
    assert _held_out(tmp_path) == splits
    assert (f"1 image under the names the splits record placed them by hold other contents, that no image had, "
            f"and keep their split as the same photos edited ({tested})") in printed


def test_two_files_alike_in_size_and_time_that_swap_names_are_told_apart(tmp_path: Path) -> None:
    """Size and modification time spare a file's hashing; where two recorded files share both (a
    fixed-size format unpacked from an archive of whole seconds), they cannot tell a swap, so those
    files are hashed."""
    images = tmp_path / "images"
    images.mkdir()
    names = [f"p{i:02d}.bmp" for i in range(20)]
    for index, name in enumerate(names):  # BMP: every file of one size
        Image.new("RGB", (8, 8), (index * 10, 0, 0)).save(images / name)
        os.utime(images / name, ns=(10**18, 10**18))
    (tmp_path / "captions.csv").write_text("image,caption\n" + "".join(f"{name},a photo\n" for name in names))

    def read():
        return read_collection(tmp_path / "captions.csv", image_root=images, seed=0, share=0.2,
                               record=tmp_path / "record.csv")

    before = read().splits
    tested = next(name for name in names if before[name] == "test")
    trained = next(name for name in names if before[name] == "train")
    (images / tested).rename(images / "swap")  # the captions swap with their photos: the same words here
    (images / trained).rename(images / tested)
    (images / "swap").rename(images / trained)
    after = read()
    assert (after.splits[tested], after.splits[trained]) == ("train", "test")
    assert after.moved_by_contents == {tested: trained, trained: tested}
    with (tmp_path / "record.csv").open(newline="") as file:
        assert next(csv.reader(file)) == COLUMNS
