"""A folder collection's splits never move (data/kept_splits.py) and each image is one key, the
file it names (data/formats/folder.py): the property over random collections and additions, the two
cases where the seed's drawing alone moved old images, and the spellings of one file."""

from __future__ import annotations

import csv
import hashlib
import random
from pathlib import Path

import pytest
from PIL import Image

from captioning.config import load_config
from captioning.data.formats.folder import folder_collection, read_collection
from captioning.data.formats.folder_report import check
from captioning.data.kept_splits import read_record
from captioning.data.records import DatasetError, ImageRecord
from captioning.train.provenance import run_record

REPO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "folder_soft.yaml"


def _write(captions_file: Path, rows: list[tuple[str, str, str]]) -> Path:
    captions_file.parent.mkdir(parents=True, exist_ok=True)
    with captions_file.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["image", "caption", "split"])
        writer.writerows(rows)
    return captions_file


def _read(captions_file: Path, *, share: float, seed: int = 0, record: Path | None = None, **options):
    return read_collection(captions_file, image_root=captions_file.parent / "images", seed=seed, share=share,
                           record=record if record is not None else captions_file.parent / "record.csv", **options)


def _draw(name: str, seed: int) -> float:
    """The seed's draw as the docs state it: SHA-256 of "seed/path"."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "big") / 2 ** 64


def _random_rows(rng: random.Random, names: list[str], style: str) -> list[tuple[str, str, str]]:
    def split() -> str:
        if style == "blank":
            return ""
        if style == "train":
            return "train"
        return rng.choice(["", "", "train", "val", "test"])
    return [(name, f"a photo of thing {rng.randrange(5)}", split()) for name in names]


def test_adding_images_with_or_without_splits_never_moves_one_that_was_there(tmp_path: Path) -> None:
    rng = random.Random(0)
    tried = 0
    for trial in range(100):
        style = rng.choice(["blank", "train", "mixed"])
        share = rng.choice([0.01, 0.05, 0.1, 0.3])
        first = [f"t{trial}_{i}.jpg" for i in range(rng.randint(3, 25))]
        rows = _random_rows(rng, first, style)
        captions_file = tmp_path / str(trial) / "captions.csv"
        try:
            before = _read(_write(captions_file, rows), share=share).splits
        except DatasetError:  # too few images for the splits asked for: nothing was made to keep
            continue
        tried += 1
        for round_ in range(3):  # photos added, with splits of their own or none, in several rounds
            added = [f"t{trial}_r{round_}_{i}.jpg" for i in range(rng.randint(1, 30))]
            rows += _random_rows(rng, added, rng.choice(["blank", "train", "mixed"]))
            after = _read(_write(captions_file, rows), share=share).splits
            moved = {image: (split, after[image]) for image, split in before.items() if after[image] != split}
            assert not moved, f"trial {trial}, round {round_}: {moved}"
            before = after
    assert tried > 60


def test_one_added_image_that_draws_into_a_small_collections_share_moves_none(tmp_path: Path) -> None:
    old = [name for name in (f"{i}.jpg" for i in range(100)) if _draw(name, 0) >= 0.1][:10]
    # no draw in either share: val and test each take the closest one
    newcomer = next(f"new{i}.jpg" for i in range(1000) if _draw(f"new{i}.jpg", 0) < 0.05)
    captions_file = _write(tmp_path / "captions.csv", [(name, "a photo", "") for name in old])
    before = _read(captions_file, share=0.05).splits
    assert sorted(before.values()).count("val") == 1 and sorted(before.values()).count("test") == 1
    after = _read(_write(captions_file, [(name, "a photo", "") for name in [*old, newcomer]]), share=0.05).splits
    assert {name: after[name] for name in old} == before and after[newcomer] == "val"


def test_added_rows_without_a_split_leave_the_val_and_test_drawn_from_training_rows(tmp_path: Path) -> None:
    old = [f"{i:03d}.jpg" for i in range(200)]
    captions_file = _write(tmp_path / "captions.csv", [(name, "a photo", "train") for name in old])
    before = _read(captions_file, share=0.05).splits
    assert 0 < list(before.values()).count("val") < 30  # drawn from the training rows
    new = [f"added{i}.jpg" for i in range(60)]
    rows = [(name, "a photo", "train") for name in old] + [(name, "a photo", "") for name in new]
    after = _read(_write(captions_file, rows), share=0.05).splits
    assert {name: after[name] for name in old} == before
    assert {after[name] for name in new} <= {"train", "val", "test"}
    assert [name for name in new if after[name] == "val"] == [name for name in new if _draw(name, 0) < 0.05]


def test_the_record_holds_every_image_and_keeps_those_that_leave_the_file(tmp_path: Path) -> None:
    names = [f"{i}.jpg" for i in range(30)]
    captions_file = _write(tmp_path / "captions.csv", [(name, "a photo", "") for name in names])
    splits = _read(captions_file, share=0.1).splits
    assert {image: placed[:2] for image, placed in read_record(tmp_path / "record.csv").items()} == {
        name: (splits[name], "") for name in names}
    val = [name for name in names if splits[name] == "val"]
    _write(captions_file, [(name, "a photo", "") for name in names if name != val[0]])  # one photo taken out
    _read(captions_file, share=0.1)
    back = _read(_write(captions_file, [(name, "a photo", "") for name in names]), share=0.1).splits
    assert back == splits  # and put back: in val again


def test_an_edited_row_moves_its_image_and_prepare_names_it(tmp_path: Path) -> None:
    names = [f"{i}.jpg" for i in range(30)]
    captions_file = _write(tmp_path / "captions.csv", [(name, "a photo", "") for name in names])
    splits = _read(captions_file, share=0.1).splits
    trained = next(name for name in names if splits[name] == "train")
    rows = [(name, "a photo", "val" if name == trained else "") for name in names]
    collection = _read(_write(captions_file, rows), share=0.1)
    assert collection.splits[trained] == "val" and collection.moved_by_rows == {trained: ("train", "val")}
    assert any(line.startswith(f"1 image the splits record kept elsewhere now in the split their rows give "
                               f"({trained}: train -> val)") for line in check(collection, max_bad_images=1))
    assert read_record(tmp_path / "record.csv")[trained][:2] == ("val", "val")


def test_a_record_that_cannot_be_written_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    captions_file = _write(tmp_path / "captions.csv", [(f"{i}.jpg", "x", "") for i in range(10)])
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(DatasetError) as raised:
        _read(captions_file, share=0.1, record=tmp_path / "file" / "splits" / "record.csv")
    assert str(raised.value).startswith(f"{tmp_path / 'file' / 'splits'}: cannot write the splits record there")
    assert str(raised.value).endswith("set data.cache_root to a folder that can hold it")


def test_a_config_keeps_its_record_under_the_cache_root(tmp_path: Path) -> None:
    _write(tmp_path / "photos" / "captions.csv", [(f"{i}.jpg", "x", "") for i in range(10)])
    data = load_config(REPO_CONFIG, [f"data.root={tmp_path / 'photos'}", f"data.cache_root={tmp_path / 'cache'}",
                                     "data.folder.split_seed=3"]).data
    collection = folder_collection(data)
    owner = hashlib.sha256(str(tmp_path / "photos" / "captions.csv").encode()).hexdigest()[:12]  # one dataset's
    assert collection.record == tmp_path / "cache" / "splits" / f"captions.csv.{owner}.seed3.share0.05.csv"
    assert {image: placed[:2] for image, placed in read_record(collection.record).items()} == {
        image: (split, "") for image, split in collection.splits.items()}
    assert sorted(path.name for path in (tmp_path / "photos").iterdir()) == ["captions.csv"]


def _photo(path: Path) -> Path:
    """A photo of its own: its colour from its path (two identical files would be one photo)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), tuple(hashlib.sha256(path.as_posix().encode()).digest()[:3])).save(path, format="PNG")
    return path


def test_one_file_under_several_spellings_is_one_image(tmp_path: Path) -> None:
    _photo(tmp_path / "images" / "a.jpg")
    _photo(tmp_path / "images" / "b.jpg")
    (tmp_path / "images" / "link.jpg").symlink_to(tmp_path / "images" / "a.jpg")
    rows = [("a.jpg", "one", "train"), ("./a.jpg", "two", ""), ("sub/../a.jpg", "three", ""),
            (str(tmp_path / "images" / "a.jpg"), "four", ""), ("link.jpg", "five", ""), ("b.jpg", "six", "val"),
            ("c.jpg", "seven", "test")]
    collection = _read(_write(tmp_path / "captions.csv", rows), share=0.1)
    assert collection.images == ["a.jpg", "b.jpg", "c.jpg"]
    assert collection.captions["a.jpg"] == ["one", "two", "three", "four", "five"]
    _photo(tmp_path / "images" / "sub" / "d.jpg")
    (tmp_path / "images" / "alias").symlink_to(tmp_path / "images" / "sub")  # a folder under two names
    (tmp_path / "out").mkdir()
    (tmp_path / "images" / "away").symlink_to(tmp_path / "out")  # a folder leading out
    rows = [("sub/d.jpg", "one", "train"), ("alias/d.jpg", "two", ""), ("alias/../b.jpg", "x", "val"),
            ("c.jpg", "y", "test")]
    collection = _read(_write(tmp_path / "captions.csv", rows), share=0.1, record=tmp_path / "folders.csv")
    assert collection.images == ["sub/d.jpg", "b.jpg", "c.jpg"] and collection.captions["sub/d.jpg"] == ["one", "two"]
    with pytest.raises(DatasetError, match=r"line 3: away/e.jpg is outside the image folder"):
        _read(_write(tmp_path / "captions.csv", [("a.jpg", "x", "train"), ("away/e.jpg", "y", "val")]), share=0.1,
              record=tmp_path / "away.csv")
    for spelling in ("./a.jpg", "link.jpg", str(tmp_path / "images" / "a.jpg")):
        twice = [("a.jpg", "one", "train"), (spelling, "two", "test"), ("b.jpg", "x", "val")]
        with pytest.raises(DatasetError, match=r"1 image in two splits \(a.jpg: train and test\)"):
            _read(_write(tmp_path / "captions.csv", twice), share=0.1, record=tmp_path / f"r{len(spelling)}.csv")


@pytest.mark.parametrize("spelling", ["../outside.jpg", "/elsewhere/outside.jpg", "out.jpg"])
def test_a_path_outside_the_image_folder_is_refused_unless_allowed(spelling: str, tmp_path: Path) -> None:
    _photo(tmp_path / "outside.jpg")
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "out.jpg").symlink_to(tmp_path / "outside.jpg")  # a link leading out
    spelling = spelling.replace("/elsewhere", str(tmp_path))
    rows = [("a.jpg", "x", "train"), ("b.jpg", "x", "val"), (spelling, "x", "test")]
    captions_file = _write(tmp_path / "captions.csv", rows)
    with pytest.raises(DatasetError) as raised:
        _read(captions_file, share=0.1)
    assert str(raised.value) == (f"{captions_file}: line 4: {spelling} is outside the image folder "
                                 f"{tmp_path / 'images'} (it is {tmp_path / 'outside.jpg'}); "
                                 "data.folder.allow_outside_images=true lets such paths in")
    allowed = _read(captions_file, share=0.1, allow_outside=True)
    assert allowed.images[-1] == str(tmp_path / "outside.jpg")
    assert allowed.records("test")[0].path == tmp_path / "outside.jpg"


def test_the_records_digests_are_keyed_by_the_files_not_the_row_positions(tmp_path: Path) -> None:
    config = load_config(REPO_CONFIG, [f"data.root={tmp_path}"])

    def record(names: list[str]) -> dict:
        split = [ImageRecord(image_id=i, path=tmp_path / name, captions=("x",)) for i, name in enumerate(names)]
        return run_record(config, train=split, val=split, vocab=["x"])["data"]

    plain, holiday = record(["a.jpg", "b.jpg"]), record(["holiday1.jpg", "holiday2.jpg"])
    assert plain["train_image_ids"] == holiday["train_image_ids"]  # row positions: the same
    assert plain["train_image_files"] != holiday["train_image_files"]
    assert plain["val_image_files"] != holiday["val_image_files"]
    assert record(["a.jpg", "b.jpg"])["train_image_files"] == plain["train_image_files"]
