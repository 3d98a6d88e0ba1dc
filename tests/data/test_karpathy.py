"""Karpathy-style split files: each split's records, restval, Flickr entries, and errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captioning.data.formats.karpathy import read_split
from captioning.data.records import DatasetError
from captioning.data.shapes.scenes import make_shapes


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small")
    make_shapes(out, {"train": 3, "val": 2, "test": 1}, seed=1, image_size=48)
    return out


def test_read_split_reads_each_split(small_dataset: Path) -> None:
    split_file = small_dataset / "dataset_shapes.json"
    sizes = {name: len(read_split(split_file, name)) for name in ("train", "val", "test")}
    assert sizes == {"train": 3, "val": 2, "test": 1}
    records = read_split(split_file, "val")
    assert all(r.path.is_file() and len(r.captions) == 5 for r in records)
    assert records[0].path == small_dataset / "images" / "val" / "val_00000.png"
    assert len({r.image_id for s in ("train", "val", "test") for r in read_split(split_file, s)}) == 6


def test_read_split_takes_restval_into_train_and_flickr_style_entries(tmp_path: Path) -> None:
    entries = [
        {"filename": "a.jpg", "split": "train", "sentences": [{"raw": "A dog."}]},
        {"filename": "b.jpg", "split": "restval", "sentences": [{"raw": "A cat."}]},
        {"filename": "c.jpg", "split": "val", "sentences": [{"raw": "A cow."}]},
    ]
    split_file = tmp_path / "dataset_flickr8k.json"
    split_file.write_text(json.dumps({"images": entries}))
    train = read_split(split_file, "train", image_root=tmp_path / "imgs")
    assert [r.path.name for r in train] == ["a.jpg", "b.jpg"]
    assert train[0].path == tmp_path / "imgs" / "a.jpg"
    assert [r.image_id for r in train] == [0, 1]  # no cocoid/imgid: the position in the file
    assert read_split(split_file, "val")[0].captions == ("A cow.",)


def test_read_split_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "dataset_coco.json"
    with pytest.raises(DatasetError, match="dataset_coco.json"):
        read_split(missing, "train")


@pytest.mark.parametrize("text", ["{not json", '{"no_images": []}', '{"images": [{"split": "train"}]}', "[1, 2]"])
def test_read_split_malformed_file_names_it(tmp_path: Path, text: str) -> None:
    split_file = tmp_path / "broken_split.json"
    split_file.write_text(text)
    with pytest.raises(DatasetError) as error:
        read_split(split_file, "train")
    assert str(split_file) in str(error.value)


def test_read_split_empty_split_is_an_error(small_dataset: Path) -> None:
    with pytest.raises(DatasetError, match="no images in split 'restval2'"):
        read_split(small_dataset / "dataset_shapes.json", "restval2")


