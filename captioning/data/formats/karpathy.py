"""Karpathy-style split files: one JSON listing every image with its split and its sentences.

The format of `dataset_coco.json`, `dataset_flickr8k.json` and `dataset_flickr30k.json` (entries
with `filepath` + `filename`, or `filename` alone for Flickr: all images in one folder,
data.image_dir), and of any file of that form (data.dataset=karpathy). For COCO 2014 these are
the splits every paper since 2015 reports on: `train` + `restval` for training (113 287 images),
`val` and `test` with 5 000 images each; images at ROOT/IMAGE_DIR/filepath/filename.
"""

from __future__ import annotations

import json
from pathlib import Path

from captioning.config import DataConfig
from captioning.config.registry import DATASETS
from captioning.data.records import DatasetError, ImageRecord, data_root, note_dropped, usable


@DATASETS.register("coco")
def read_coco(data: DataConfig, split: str) -> list[ImageRecord]:
    """COCO in Karpathy's split file, read as the others are; COCO's instances files annotate its images."""
    return read_karpathy(data, split)


read_coco.instances = True  # CHAIR and attention correctness on masks (captioning.data.instances)


@DATASETS.register("flickr8k", "flickr30k", "karpathy")
def read_karpathy(data: DataConfig, split: str) -> list[ImageRecord]:
    """One split of data.root/data.split_file."""
    return read_configured(data, split, where=f"docs/coco.md says what the {data.dataset} data holds")


def read_configured(data: DataConfig, split: str, *, where: str) -> list[ImageRecord]:
    """One split of the split file a config names (data.root/data.split_file, images under
    data.root/data.image_dir); `where` says where the data comes from when data.root is missing."""
    root = data_root(data, where=where)
    return read_split(root / data.split_file, split, image_root=root / data.image_dir)


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
