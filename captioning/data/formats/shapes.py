"""The shapes data (captioning.data.shapes): scenes the project draws, in a Karpathy-style split file."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from captioning.config import Config, DataConfig
from captioning.config.choices import SHAPES_METRICS
from captioning.config.registry import DATASETS
from captioning.data.formats.karpathy import read_configured
from captioning.data.records import DatasetError, ImageRecord
from captioning.data.shapes import SHAPES_DEFAULT_COUNTS
from captioning.data.shapes.destination import DATASET, foreign_entries, listed
from captioning.data.shapes.scenes import SceneObjects, make_shapes, read_scene_objects


@DATASETS.register("shapes")
def read_shapes(data: DataConfig, split: str) -> list[ImageRecord]:
    """One split of data.root/data.split_file, which `captioning make-shapes` writes."""
    return read_configured(data, split, where=f"`captioning make-shapes --out {data.root}` makes it")


# What validation measures on this format beside the caption metrics (captioning.eval.shapes.scorer):
# train.val_metric may name these too (captioning.config.checks reads them off the reader).
read_shapes.validation_metrics = SHAPES_METRICS


def scenes(data: DataConfig, records: list[ImageRecord]) -> list[SceneObjects] | None:
    """Each image's objects (data.root/objects.json, which `captioning make-shapes` writes): what the
    shapes data's scores read (captioning.eval.shapes.scorer); None where the file is not there."""
    objects = Path(data.root) / "objects.json"
    return read_scene_objects(objects, [r.image_id for r in records]) if objects.exists() else None


read_shapes.scenes = scenes

# A dry run's shapes data where none is there: as many scenes as it reads (captioning.train.dry_run).
MINIATURE_COUNTS = {"train": 8, "val": 2, "test": 2}


def ensure_shapes(config: Config) -> None:
    """The embedded default makes its own data: `python train.py` works on a fresh clone. Called by
    the commands that train or prepare (captioning/cli), never by a reader: reading data never writes it.
    Made only where data.root is missing, empty or holds an unfinished shapes dataset, never into a
    folder of other files (captioning.data.shapes.destination)."""
    d = config.data
    root = Path(d.root)
    if d.dataset == "shapes" and not (root / d.split_file).exists():
        if foreign := foreign_entries(root, DATASET):  # someone's folder, named as data.root: never filled with scenes
            raise DatasetError(f"{root}: the shapes data (data.dataset=shapes, the embedded default) is not there, and "
                               f"the folder holds other files ({listed(foreign)}); nothing written: for your own "
                               "photos set data.dataset=folder (docs/data.md), else set data.root to a new or empty "
                               "folder")
        try:  # a read-only data.root is one line before any work (data.cache_root holds caches, never the data)
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=root):
                pass
        except OSError as error:
            raise DatasetError(f"{root}: the shapes data is not there and cannot be made there "
                               f"({error.strerror or error}); make it where you can write, `captioning make-shapes "
                               "--out DIR`, and set data.root=DIR") from error
        print(f"{root / d.split_file} not found: generating the shapes dataset there", file=sys.stderr)
        make_shapes(root, dict(SHAPES_DEFAULT_COUNTS), image_size=d.image_size)


def miniature(config: Config, folder: Path) -> None:
    """A dry run's data (captioning.train.dry_run): where the shapes data is not there, a few scenes
    drawn under `folder`, and the config pointed at them (not the full dataset, made for a check)."""
    if not (Path(config.data.root) / config.data.split_file).exists():
        config.data.root = str(folder / "shapes")
        make_shapes(config.data.root, MINIATURE_COUNTS, image_size=config.data.image_size)


read_shapes.make_missing = ensure_shapes  # the commands that train or prepare draw it where it is missing
read_shapes.miniature = miniature
