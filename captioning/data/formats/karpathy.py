"""Karpathy-style split files: one JSON listing every image with its split and its sentences.

The format of `dataset_coco.json`, `dataset_flickr8k.json` and `dataset_flickr30k.json` (entries
with `filepath` + `filename`, or `filename` alone for Flickr: all images in one folder,
data.image_dir), and of any file of that form (data.dataset=karpathy). For COCO 2014 these are
the splits every paper since 2015 reports on: `train` + `restval` for training (113 287 images),
`val` and `test` with 5 000 images each; images at ROOT/IMAGE_DIR/filepath/filename.

The captions can come from a file of their own in Flickr8k's token format instead (data.token_file):
Flickr8k.token.txt, or the same photos' captions in another language; the split file still places
each image in its split.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace
from pathlib import Path

from captioning.config import DataConfig
from captioning.config.registry import DATASETS
from captioning.data.records import DatasetError, ImageRecord, counted, data_root, note_dropped, usable


@DATASETS.register("coco")
def read_coco(data: DataConfig, split: str) -> list[ImageRecord]:
    """COCO in Karpathy's split file, read as the others are; COCO's instances files annotate its images."""
    return read_karpathy(data, split)


read_coco.instances = True  # CHAIR and attention correctness on masks (captioning.data.instances)


@DATASETS.register("flickr8k", "flickr30k", "karpathy")
def read_karpathy(data: DataConfig, split: str) -> list[ImageRecord]:
    """One split of data.root/data.split_file."""
    return read_configured(data, split, where=f"docs/coco.md says what the {data.dataset} data holds")


read_karpathy.reads_token_file = read_coco.reads_token_file = True  # data.token_file


def read_configured(data: DataConfig, split: str, *, where: str) -> list[ImageRecord]:
    """One split of the split file a config names (data.root/data.split_file, images under
    data.root/data.image_dir), with the captions of data.token_file where it names one; `where`
    says where the data comes from when data.root is missing."""
    root = data_root(data, where=where)
    records = read_split(root / data.split_file, split, image_root=root / data.image_dir)
    if data.token_file is None:
        return records
    return with_captions_of(root / data.token_file, records, split=split)


def with_captions_of(token_file: Path, records: list[ImageRecord], *, split: str) -> list[ImageRecord]:
    """The records with the captions a token file gives their image files in place of their own;
    those it gives none are left out, counted in one line."""
    captions = read_token_file(token_file)
    kept = [replace(record, captions=tuple(captions[record.path.name])) for record in records
            if record.path.name in captions]
    if not kept:
        raise DatasetError(f"{token_file}: no caption of any of the {counted(len(records), 'image')} of split "
                           f"'{split}' (its lines name image files: '<image file>#<i><TAB><caption>')")
    if len(kept) < len(records):
        _say_once(f"note: {token_file}: {split}: {len(records) - len(kept)} of {counted(len(records), 'image')} "
                  "have no caption there, left out")
    return kept


@functools.cache
def _say_once(line: str) -> None:
    """A line on stderr, once a process: a run reads its splits more than once."""
    print(line, file=sys.stderr)


def read_token_file(path: Path) -> dict[str, list[str]]:
    """Flickr8k's token format, `<image file>#<i><TAB><caption>` a line (Flickr8k.token.txt, and the
    captions of its photos in other languages), as each image file's usable captions in file order."""
    try:
        # utf-8-sig: an editor's byte-order mark is no part of the first image's name. Lines end at
        # "\n" ("\r\n" too) only: splitlines would also cut a caption at U+2028 or a form feed.
        lines = [line.removesuffix("\r") for line in path.read_text(encoding="utf-8-sig").split("\n")]
    except FileNotFoundError as error:
        raise DatasetError(f"{path}: captions file not found") from error
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path}: not UTF-8 text (byte {error.start})") from error
    captions: dict[str, list[str]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        key, tab, caption = line.partition("\t")
        name, hash_mark, _ = key.rpartition("#")
        if not tab or not hash_mark or not name:
            raise DatasetError(f"{path}: line {number} is not '<image file>#<i><TAB><caption>': {line[:60]!r}")
        captions.setdefault(name, [])
        captions[name] += usable([caption])
    return {name: kept for name, kept in captions.items() if kept}


def read_split(split_file: str | Path, split: str, *, image_root: str | Path | None = None) -> list[ImageRecord]:
    """Images of one split ('train' also takes Karpathy's 'restval'), in file order.

    Image paths are image_root / filepath / filename, image_root defaulting to the file's folder.
    """
    split_file = Path(split_file)
    image_root = Path(image_root) if image_root is not None else split_file.parent
    try:
        entries = json.loads(split_file.read_text())["images"]
    except FileNotFoundError as error:
        raise DatasetError(f"{split_file}: split file not found") from error
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        problem = f"{error.__class__.__name__}: {error}"
        raise DatasetError(f"{split_file}: not a Karpathy-style split file ({problem})") from error
    wanted = {"train", "restval"} if split == "train" else {split}
    records, dropped, emptied = [], 0, 0
    for position, entry in enumerate(entries):
        try:
            if entry["split"] not in wanted:
                continue
            image_id = int(entry.get("cocoid", entry.get("imgid", position)))
            path = image_root / entry.get("filepath", "") / entry["filename"]
            raw = [sentence["raw"] for sentence in entry["sentences"]]
        except (KeyError, TypeError, ValueError) as error:
            raise DatasetError(f"{split_file}: image entry {position} is malformed (missing {error})") from error
        captions = usable(raw)
        dropped += len(raw) - len(captions)
        if not captions:
            emptied += 1
            continue
        records.append(ImageRecord(image_id=image_id, path=path, captions=captions))
    note_dropped(split_file, split, dropped, emptied)
    if not records:
        raise DatasetError(f"{split_file}: no images in split '{split}'")
    return records
