"""The splits record knows each image by its contents beside its path (data/kept_splits.py): photos
moved, renamed or copied keep their split, recorded photos gone while new ones came are said, one
record per dataset (also under a shared data.cache_root), a record readable by the other users of a
shared dataset, and a record a spreadsheet saved in another encoding is one line."""

from __future__ import annotations

import csv
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from captioning.config import load_config
from captioning.data import kept_splits
from captioning.data.formats.folder import folder_collection, read_collection
from captioning.data.formats.folder_report import check
from captioning.data.kept_splits import read_record
from captioning.data.records import DatasetError
from tests.rights import as_another_user
from tests.tiny import REPO

CONFIG = REPO / "configs" / "folder_soft.yaml"


def _photos(root: Path, names: list[str], *, shade: int = 0) -> None:
    """A photo of its own colour for each name, saved losslessly (no two alike unless `shade` repeats
    one; a JPEG would round close colours to the same bytes), and the captions file naming them."""
    for index, name in enumerate(names):
        (root / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (index % 250, index // 250, shade)).save(root / "images" / name, format="PNG")
    _captions(root, names)


def _captions(root: Path, names: list[str]) -> Path:
    with (root / "captions.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["image", "caption"])
        writer.writerows((name, f"a photo of thing {i % 4}") for i, name in enumerate(names))
    return root / "captions.csv"


def _read(root: Path, *, record: Path | None = None):
    return read_collection(root / "captions.csv", image_root=root / "images", seed=0, share=0.1,
                           record=record or root / "splits" / "record.csv")


def test_photos_moved_into_a_folder_keep_their_splits_and_prepare_says_so(tmp_path: Path) -> None:
    names = [f"p{i:02d}.jpg" for i in range(60)]
    _photos(tmp_path, names)
    before = _read(tmp_path).splits
    assert {"val", "test"} <= set(before.values())
    (tmp_path / "images" / "2024").mkdir()
    for name in names:  # every photo moved into images/2024/, and the captions file says so
        (tmp_path / "images" / name).rename(tmp_path / "images" / "2024" / name)
    _captions(tmp_path, [f"2024/{name}" for name in names])
    after = _read(tmp_path)
    assert {name: after.splits[f"2024/{name}"] for name in names} == before
    assert after.moved_by_contents == {f"2024/{name}": name for name in names}
    lines = check(after, max_bad_images=1)
    assert any(line.startswith("60 images moved, renamed or copied since the splits record placed them keep their "
                               "split, known by their contents (2024/p00.jpg (was p00.jpg), ") for line in lines)
    assert _read(tmp_path).moved_by_contents == {}  # written down: the next read finds them by name


def test_a_photo_renamed_or_copied_into_a_new_folder_keeps_its_split(tmp_path: Path) -> None:
    names = [f"p{i:02d}.jpg" for i in range(40)]
    _photos(tmp_path, names)
    before = _read(tmp_path).splits
    held_out = next(name for name in names if before[name] != "train")
    (tmp_path / "images" / held_out).rename(tmp_path / "images" / "renamed.jpg")
    (tmp_path / "images" / "copies").mkdir()
    shutil.copy(tmp_path / "images" / "renamed.jpg", tmp_path / "images" / "copies" / "again.jpg")
    _captions(tmp_path, [name for name in names if name != held_out] + ["renamed.jpg", "copies/again.jpg"])
    after = _read(tmp_path).splits
    assert after["renamed.jpg"] == after["copies/again.jpg"] == before[held_out]


def test_photos_gone_while_others_came_are_said_in_one_line(tmp_path: Path) -> None:
    names = [f"p{i:02d}.jpg" for i in range(30)]
    _photos(tmp_path, names)
    _read(tmp_path)
    for name in names[:5]:  # five replaced by photos the record has not seen, under new names
        (tmp_path / "images" / name).unlink()
    _photos(tmp_path, [f"new{i}.jpg" for i in range(5)], shade=99)
    _captions(tmp_path, names[5:] + [f"new{i}.jpg" for i in range(5)])  # the rest as before, and the new ones
    lines = [line for line in check(_read(tmp_path), max_bad_images=1) if "of the splits record" in line]
    assert lines == ["5 images of the splits record no longer in captions.csv (p00.jpg, p01.jpg, p02.jpg, ...) while "
                     "5 images with contents the record does not know appeared (new0.jpg, new1.jpg, new2.jpg, ...): "
                     "those were placed as new photos; if they are the old ones edited (resized, re-encoded), a model "
                     "may be tested on what an older run trained on"]
    assert not [line for line in check(_read(tmp_path), max_bad_images=1) if "of the splits record" in line]


def test_an_unchanged_file_is_not_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"p{i:02d}.jpg" for i in range(20)]
    _photos(tmp_path, names)
    _read(tmp_path)
    hashed = []
    digest = kept_splits.file_digest
    monkeypatch.setattr(kept_splits, "file_digest", lambda path: hashed.append(Path(path).name) or digest(path))
    _read(tmp_path)
    assert hashed == []
    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "images" / "p03.jpg")  # replaced under its own name
    os.utime(tmp_path / "images" / "p03.jpg", ns=(1, 1))
    again = _read(tmp_path)
    assert hashed == ["p03.jpg"] and again.moved_by_contents == {}
    assert read_record(tmp_path / "splits" / "record.csv")["p03.jpg"].stat[1] == 1


def test_two_datasets_under_one_cache_root_keep_records_of_their_own_and_a_moved_one_finds_its_own(
        tmp_path: Path) -> None:
    names = [f"p{i:02d}.jpg" for i in range(40)]
    for dataset in ("one", "two"):
        _photos(tmp_path / dataset, names, shade=1 if dataset == "one" else 2)

    def collection(root: Path):
        return folder_collection(load_config(CONFIG, [f"data.root={root}", f"data.cache_root={tmp_path / 'cache'}",
                                                      "data.folder.split_share=0.2"]).data)

    one, two = collection(tmp_path / "one"), collection(tmp_path / "two")
    assert one.record != two.record and one.adopted is None and two.adopted is None
    contents = [{placed.contents for placed in read_record(each.record).values()} for each in (one, two)]
    assert contents[0].isdisjoint(contents[1])  # the same names, other photos: each in its own record
    shutil.move(tmp_path / "one", tmp_path / "moved")
    moved = collection(tmp_path / "moved")
    assert moved.splits == one.splits and moved.adopted == (one.record, 40)
    said = f"40 images of this data found in the splits record {one.record} (the data's own, or this data's before"
    assert any(line.startswith(said) for line in check(moved, max_bad_images=1))
    kept = read_record(moved.record)  # its own record from now on
    assert {image: placed.split for image, placed in kept.items()} == one.splits


def test_the_record_is_readable_by_the_other_users_of_a_shared_dataset(tmp_path: Path) -> None:
    names = [f"p{i:02d}.jpg" for i in range(30)]
    _photos(tmp_path / "shared", names)
    record = _read(tmp_path / "shared", record=tmp_path / "shared" / "splits" / "r.csv").record
    assert stat.S_IMODE(record.stat().st_mode) == 0o666 & ~_umask()
    out = tmp_path / "mine"
    command = [sys.executable, "-m", "captioning.cli", "prepare", "--config", str(CONFIG), "--quiet",
               f"data.root={tmp_path / 'shared'}", f"train.out_dir={out}"]
    owned = folder_collection(load_config(CONFIG, [f"data.root={tmp_path / 'shared'}"]).data)  # its owner's prepare
    out.mkdir()
    done = as_another_user(command, owner_of=[tmp_path / "shared"], writable=[out])
    assert done.returncode == 0, done.stderr
    assert f"splits kept in {owned.record}" in done.stdout and "Traceback" not in done.stderr


def test_a_record_others_may_not_read_or_saved_in_another_encoding_is_one_line(tmp_path: Path) -> None:
    names = [f"p{i:02d}.jpg" for i in range(30)]
    _photos(tmp_path, names)
    record = _read(tmp_path).record
    text = record.read_text(encoding="utf-8")
    record.write_bytes(text.replace("p00.jpg", "p\u00e900.jpg").encode("cp1252"))  # a spreadsheet's "CSV"
    with pytest.raises(DatasetError) as raised:
        read_record(record)
    assert str(raised.value).startswith(f"{record}: the splits record is not UTF-8 text (byte ")
    assert str(raised.value).endswith("save it as UTF-8 (a spreadsheet's \"CSV UTF-8\")")
    record.write_text(text, encoding="utf-8")
    record.chmod(0o600)
    probe = [sys.executable, "-c", "from pathlib import Path; from captioning.data.kept_splits import read_record; "
             f"read_record(Path({str(record)!r}))"]
    done = as_another_user(probe, owner_of=[tmp_path], writable=[])
    assert done.returncode != 0 and "DatasetError" in done.stderr
    assert f"{record}: the splits record cannot be read (Permission denied); its owner can let others read it" \
           in done.stderr


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_probe_without_rights_cannot_write_here(tmp_path: Path) -> None:
    """The helper the rights tests stand on: without write rights, a file cannot be made."""
    (tmp_path / "ro").mkdir()
    done = as_another_user(["touch", str(tmp_path / "ro" / "new")], owner_of=[tmp_path / "ro"], writable=[])
    assert done.returncode != 0 and not (tmp_path / "ro" / "new").exists()
    assert subprocess.run(["touch", str(tmp_path / "ro" / "new")]).returncode == 0  # with them, it can


def test_an_image_used_through_a_link_is_not_said_to_have_no_caption(tmp_path: Path) -> None:
    names = [f"p{i:02d}.jpg" for i in range(10)]
    _photos(tmp_path, names)
    (tmp_path / "images" / "link.jpg").symlink_to(tmp_path / "images" / "p00.jpg")
    (tmp_path / "images" / "stray.jpg").write_bytes((tmp_path / "images" / "p01.jpg").read_bytes())
    _captions(tmp_path, ["link.jpg", *names[1:]])  # p00.jpg's captions name it through the link
    lines = [line for line in check(_read(tmp_path), max_bad_images=1) if "with no caption" in line]
    assert lines == [f"1 image in {tmp_path / 'images'} with no caption in captions.csv, not used (stray.jpg)"]
