"""COCO's instances annotations: which objects each image holds, and where (their segmentations).

Evaluation scores object hallucination (CHAIR) and attention correctness against them
(captioning.eval.coco). The files are large (instances_train2014.json is about 330 MB), so a split
reads them once, when first asked, and keeps only its own images' objects: each object's category
name and its segmentation as the file stores it (polygons or run-length encoding). A mask is
decoded only when a caption is scored (`instance_mask`), never for a whole split at once.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captioning.config import DataConfig
from captioning.data.records import DatasetError, format_extra


@dataclass(frozen=True)
class ImageObjects:
    """One image's annotated objects: (category name, segmentation) each, on a width x height image."""

    width: int
    height: int
    objects: tuple[tuple[str, Any], ...]

    @property
    def categories(self) -> set[str]:
        return {name for name, _ in self.objects}

    def mask(self, category: str) -> np.ndarray:
        """The union of the category's instance masks: [height, width] bool (all False if it has none)."""
        union = np.zeros((self.height, self.width), dtype=bool)
        for name, segmentation in self.objects:
            if name == category:
                union |= instance_mask(segmentation, width=self.width, height=self.height)
        return union


def instance_mask(segmentation: Any, *, width: int, height: int) -> np.ndarray:
    """One object's mask [height, width] bool, decoded as pycocotools' COCO.annToMask does: polygons
    (a list of [x0, y0, x1, y1, ...]) merged, uncompressed RLE (a crowd: counts as a list) and
    compressed RLE alike."""
    from pycocotools import mask as coco_mask

    if isinstance(segmentation, list):  # polygons of one object
        rle = coco_mask.merge(coco_mask.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation.get("counts"), list):  # uncompressed RLE
        rle = coco_mask.frPyObjects(segmentation, height, width)
    else:
        rle = segmentation
    return coco_mask.decode(rle).astype(bool)


def read_instances(files: Sequence[Path], image_ids: Sequence[int]) -> dict[int, ImageObjects]:
    """The objects of the images `image_ids` found in the instances files, read one after another
    until every image is found (files that do not exist are passed over). An image without objects
    that a file lists is there with none; an image no file lists is not."""
    from pycocotools.coco import COCO

    wanted, found = set(image_ids), {}
    for path in files:
        if not Path(path).is_file() or wanted <= found.keys():
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
                coco = COCO(str(path))
            names = {category["id"]: category["name"] for category in coco.dataset["categories"]}
            for image_id in wanted & coco.imgs.keys():
                image = coco.imgs[image_id]
                objects = tuple((names[a["category_id"]], a["segmentation"]) for a in coco.imgToAnns[image_id])
                found[image_id] = ImageObjects(int(image["width"]), int(image["height"]), objects)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AssertionError) as error:
            raise DatasetError(f"{path}: not a COCO instances file ({error.__class__.__name__}: {error})") \
                from error
        del coco  # the whole file's index: only the split's images are kept
    return found


def instances_files(data: DataConfig) -> list[Path]:
    """Where the dataset's instances files are: val2014's first, since the Karpathy val and test
    splits (and coco_official's) are all val2014 images, and reading stops once every image is found."""
    return [Path(data.root) / data.val_instances, Path(data.root) / data.train_instances]


class Instances:
    """A split's images' objects (ImageObjects, or None for an image no file lists), read from the
    instances files the first time they are asked for, then kept; None where no file is there, said
    once on stderr in one line."""

    def __init__(self, files: Sequence[Path], image_ids: Sequence[int]):
        self.files, self.image_ids = [Path(f) for f in files], list(image_ids)
        self._read = False
        self._objects: list[ImageObjects | None] | None = None

    def objects(self) -> list[ImageObjects | None] | None:
        if not self._read:
            self._read = True
            self._objects = self._load()
        return self._objects

    def _load(self) -> list[ImageObjects | None] | None:
        names = ", ".join(str(f) for f in self.files)
        if not any(f.is_file() for f in self.files):
            print(f"note: no COCO instances file ({names}): evaluating without CHAIR and attention correctness",
                  file=sys.stderr)
            return None
        found = read_instances(self.files, self.image_ids)
        missing = sum(i not in found for i in self.image_ids)
        if missing:
            print(f"note: {missing} of {len(self.image_ids)} images are in no instances file ({names}): "
                  "left out of CHAIR and attention correctness", file=sys.stderr)
        return [found.get(i) for i in self.image_ids]


def split_instances(data: DataConfig, image_ids: Sequence[int]) -> Instances | None:
    """The instances of a COCO split's images (read when first asked for); None for a dataset whose
    format says COCO's instances files do not annotate it (its reader's `instances`)."""
    return Instances(instances_files(data), image_ids) if format_extra(data, "instances") else None
