"""The real datasets: COCO 2014, Flickr8k/30k and a folder of your own, as lists of image records per split.

Two ways to read COCO 2014:
  - Karpathy's split file `dataset_coco.json` (the splits every paper since 2015 reports on):
    `train` + `restval` for training (113 287 images), `val` and `test` with 5 000 images each;
    images at ROOT/IMAGE_DIR/filepath/filename, i.e. ROOT/train2014/... and ROOT/val2014/....
  - The official `captions_train2014.json` / `captions_val2014.json`, read with pycocotools: train
    is train2014 (82 783 images) and val2014 (40 504) serves as both val and test.
Flickr8k and Flickr30k come as Karpathy files whose entries have a `filename` but no `filepath`:
all images lie in one folder, `data.image_dir` (e.g. Flicker8k_Dataset, flickr30k-images).
A folder of your own images comes with a captions file (captioning.data.collection).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from pathlib import Path

from captioning.config import DATASETS, DataConfig
from captioning.data.collection import folder_collection
from captioning.data.karpathy import DatasetError, ImageRecord, note_dropped, read_split, usable

SPLITS = ("train", "val", "test")


def read_coco_captions(annotation_file: str | Path, image_dir: str | Path) -> list[ImageRecord]:
    """Every image of an official COCO captions file, with all its captions, in image-id order."""
    from pycocotools.coco import COCO

    annotation_file = Path(annotation_file)
    if not annotation_file.is_file():
        raise DatasetError(f"{annotation_file}: COCO captions file not found")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            coco = COCO(str(annotation_file))
        records, dropped, emptied = [], 0, 0
        for image_id in sorted(coco.getImgIds()):
            image = coco.loadImgs(image_id)[0]
            raw = [a.get("caption") for a in coco.loadAnns(coco.getAnnIds(imgIds=image_id))]
            captions = usable(raw)
            dropped += len(raw) - len(captions)
            emptied += bool(raw) and not captions
            if captions:
                records.append(ImageRecord(image_id=int(image_id), path=Path(image_dir) / image["file_name"],
                                           captions=captions))
        note_dropped(annotation_file, "all", dropped, emptied)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AssertionError) as error:
        raise DatasetError(f"{annotation_file}: not a COCO captions file ({error.__class__.__name__}: {error})") \
            from error
    if not records:
        raise DatasetError(f"{annotation_file}: no captioned images")
    return records


def read_records(data: DataConfig, split: str) -> list[ImageRecord]:
    """The images and raw reference captions of one split of the configured dataset (with
    data.max_images, only the first that many whose files exist)."""
    records = _all_records(data, split)
    if data.max_images is None:
        return records
    return list(itertools.islice((r for r in records if r.path.is_file()), data.max_images))


def held_out_note(data: DataConfig) -> str | None:
    """One line where the data has no test split (a split file whose test images are held out, as a
    user holding back their own test set has): training and `eval.py --split val` need none."""
    try:
        read_records(data, "test")
    except DatasetError as error:
        return (f"note: no test split ({error}): models are selected and scored on val "
                "(eval.py --split val); the checkpoints' record names no test images")
    return None


def _all_records(data: DataConfig, split: str) -> list[ImageRecord]:
    if data.dataset not in DATASETS:
        raise DatasetError(f"unknown dataset '{data.dataset}' (known: {', '.join(DATASETS)})")
    if split not in SPLITS:
        raise DatasetError(f"unknown split '{split}' (known: {', '.join(SPLITS)})")
    root = Path(data.root)
    if not root.is_dir():
        where = {"shapes": f"`captioning make-shapes --out {root}` makes it",
                 "folder": "docs/data.md says what a folder of your own images holds"}.get(
            data.dataset, f"docs/coco.md says what the {data.dataset} data holds")
        raise DatasetError(f"{root}: data.root is not a folder ({where})")
    if data.dataset == "folder":
        return folder_collection(data).records(split)
    if data.dataset == "coco_official":
        if split == "train":
            return read_coco_captions(root / data.train_captions, root / data.train_images)
        return read_coco_captions(root / data.val_captions, root / data.val_images)
    return read_split(root / data.split_file, split, image_root=root / data.image_dir)
