"""The splits of a folder collection, written down when first given and read back at every later
read, so that no image ever moves to another split (a model is never tested on what an older run
trained on).

A split drawn from each image's own hash already stays put as photos are added, but two rules of the
drawing look at the whole collection: a small collection gets at least one image in each made split
(the one whose draw comes closest), and when every row says train, val and test are drawn from the
training rows. Adding photos changes what those rules see; the record does not change.

The record is CSV, one row per image ever placed, `image,split,given`: the image's resolved path
(relative to the image folder), its split, and the split its rows gave when it was placed ("" for
none). It lives under DATA_CACHE/splits/ (data.cache_root, else data.root), named after the captions
file, data.split_seed and data.split_share: another seed or share draws afresh, in a record of its own.
Images that leave the captions file keep their row, so that coming back they come back to their split.
"""

from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path

from captioning.data.karpathy import DatasetError

COLUMNS = ["image", "split", "given"]


def record_path(cache_root: Path, captions_file: Path, *, seed: int, share: float) -> Path:
    """DATA_CACHE/splits/<captions file>.seed<seed>.share<share>.csv."""
    return Path(cache_root) / "splits" / f"{Path(captions_file).name}.seed{seed}.share{share:g}.csv"


def read_record(path: Path) -> dict[str, tuple[str, str]]:
    """image -> (split, the split its rows gave then); empty where there is no record yet."""
    if not path.is_file():
        return {}
    with path.open(newline="", encoding="utf-8") as file:
        reader = csv.reader(file)
        if next(reader, None) != COLUMNS:
            raise DatasetError(f"{path}: not a splits record (its first line is not {','.join(COLUMNS)}); "
                               "move it away to draw the splits again")
        record = {}
        for row in reader:
            if len(row) != 3 or row[1] not in ("train", "val", "test"):
                raise DatasetError(f"{path}: line {reader.line_num} is not image,split,given")
            record[row[0]] = (row[1], row[2])
    return record


def write_record(path: Path, record: dict[str, tuple[str, str]]) -> None:
    """The whole record, replaced at once (a reader never sees half of it; ranks that write it at the
    same time write the same rows)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", newline="",
                                         encoding="utf-8", delete=False) as file:
            writer = csv.writer(file)
            writer.writerow(COLUMNS)
            writer.writerows([image, split, given] for image, (split, given) in record.items())
        os.replace(file.name, path)
    except OSError as error:
        raise DatasetError(f"{path.parent}: cannot write the splits record there ({error.strerror or error}); "
                           "set data.cache_root to a folder that can hold it") from error
