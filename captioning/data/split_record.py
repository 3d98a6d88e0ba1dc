"""The splits of a folder collection: drawn for the images whose rows give none (`assign_splits`),
written down when first given and read back at every later read, so that no image ever moves to
another split (a model is never tested on what an older run trained on).

A split drawn from each image's own hash already stays put as photos are added, but two rules of the
drawing look at the whole collection: a small collection gets at least one image in each made split
(the one whose draw comes closest), and when every row says train, val and test are drawn from the
training rows. Adding photos changes what those rules see; the record does not change.

The record is CSV, one row per image ever placed, `image,split,given`: the image's resolved path
(relative to the image folder), its split, and the split its rows gave when it was placed ("" for
none). It lives under DATA_CACHE/splits/ (data.cache_root, else data.root), named after the captions
file, data.folder.split_seed and data.folder.split_share: another seed or share draws afresh, in a record of its own.
Images that leave the captions file keep their row, so that coming back they come back to their split.
"""

from __future__ import annotations

import csv
import hashlib
import os
import tempfile
from pathlib import Path

from captioning.data.records import DatasetError

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


def split_draw(image: str, *, seed: int) -> float:
    """A number in [0, 1) fixed by the image's path and the seed alone: where a made split puts it."""
    digest = hashlib.sha256(f"{seed}/{image}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def assign_splits(given: dict[str, str], kept: dict[str, tuple[str, str]], *, seed: int, share: float,
                   source: Path, record: Path | None) -> tuple[dict[str, str], list[str]]:
    """Every image's split, from what its rows give (`given`, "" for none) and what the record kept.

    An image the record holds keeps its split, unless its rows now give another than they gave then
    (the captions file edited: the user's word, which `prepare` names). A new image takes the split its
    rows give; without one, the split its own draw falls in, for each split that no row names (val:
    [0, share), test: [share, 2 share), else train). Where no row leaves a split empty, val and test
    are drawn so from the new training rows. A made split left empty (a small collection) takes the
    free new image whose draw comes closest. Returns (splits, the images whose rows moved them)."""
    splits: dict[str, str] = {}
    changed = []
    for image, split in given.items():
        if image in kept:
            kept_split, given_then = kept[image]
            edited = bool(split) and split not in (given_then, kept_split)
            if edited:
                changed.append(image)
            splits[image] = split if edited else kept_split
        elif split:
            splits[image] = split
    named = set(given.values())
    missing = [s for s in ("val", "test") if s not in named]
    fresh = [image for image in given if image not in kept]
    drawn_from = "" if "" in named else "train"  # the images without a split, or else the training ones
    pool = [image for image in fresh if given[image] == drawn_from]
    if missing and not kept and len(pool) < len(missing) + 1:
        raise DatasetError(f"{source}: too few images to make the {' and '.join(missing)} split from "
                           f"({len(pool)}); give some rows a split")
    free = set(pool)
    draws = {image: split_draw(image, seed=seed) for image in pool}
    for order, split in enumerate(missing):
        low, high = order * share, (order + 1) * share
        chosen = [image for image in pool if image in free and low <= draws[image] < high]
        if not chosen and split not in splits.values():  # a small collection: at least one image
            candidates = [image for image in pool if image in free]
            if not candidates:
                raise DatasetError(f"{source}: no row names a {split} split and the splits record {record} holds "
                                   f"none of these images in it; give some rows split {split}, or move the record "
                                   "away to draw the splits again (an image trained on may then be tested on)")
            chosen = [min(candidates, key=lambda image: abs(draws[image] - low))]
        for image in chosen:
            splits[image] = split
            free.discard(image)
    for image in fresh:
        splits.setdefault(image, "train")
    if not any(split == "train" for split in splits.values()):
        raise DatasetError(f"{source}: no training images (every row's split is val or test)")
    return {image: splits[image] for image in given}, changed
