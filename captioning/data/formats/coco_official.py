"""COCO 2014's official captions files (data.dataset=coco_official), read with pycocotools.

`captions_train2014.json` / `captions_val2014.json` (data.coco_official: train_captions, val_captions):
train is train2014 (82 783 images) and val2014 (40 504) serves as both val and test. For Karpathy's
splits of COCO, data.dataset=coco reads `dataset_coco.json` (formats/karpathy.py).
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

from captioning.config import DataConfig
from captioning.config.registry import DATASETS
from captioning.data.records import DatasetError, ImageRecord, data_root, note_dropped, usable


@dataclass
class CocoOfficialConfig:
    """data.coco_official: where COCO's own captions files and images are, under data.root."""

    train_captions: str = "annotations/captions_train2014.json"  # the train split's captions
    train_images: str = "train2014"  # and its images' folder
    val_captions: str = "annotations/captions_val2014.json"  # val2014's: the val split's and the test split's
    val_images: str = "val2014"  # and their images' folder


@DATASETS.register("coco_official", settings=CocoOfficialConfig)
def read_official(data: DataConfig, split: str) -> list[ImageRecord]:
    """train from the train captions file; val and test both from the val file."""
    root, files = data_root(data, where="docs/coco.md says what the coco_official data holds"), data.coco_official
    if split == "train":
        return read_coco_captions(root / files.train_captions, root / files.train_images)
    return read_coco_captions(root / files.val_captions, root / files.val_images)


read_official.instances = True  # CHAIR and attention correctness on masks (captioning.data.instances)


def read_coco_captions(captions_file: str | Path, image_dir: str | Path) -> list[ImageRecord]:
    """Every image of an official COCO captions file, with all its captions, in image-id order."""
    from pycocotools.coco import COCO

    captions_file = Path(captions_file)
    if not captions_file.is_file():
        raise DatasetError(f"{captions_file}: COCO captions file not found")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            coco = COCO(str(captions_file))
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
        note_dropped(captions_file, "all", dropped, emptied)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AssertionError) as error:
        raise DatasetError(f"{captions_file}: not a COCO captions file ({error.__class__.__name__}: {error})") \
            from error
    if not records:
        raise DatasetError(f"{captions_file}: no captioned images")
    return records
