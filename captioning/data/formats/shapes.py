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
from captioning.data.shapes.scenes import make_shapes


@DATASETS.register("shapes")
def read_shapes(data: DataConfig, split: str) -> list[ImageRecord]:
    """One split of data.root/data.split_file, which `captioning make-shapes` writes."""
    return read_configured(data, split, where=f"`captioning make-shapes --out {data.root}` makes it")


# What validation measures on this format beside the caption metrics (captioning.eval.shapes.scorer):
# train.val_metric may name these too (captioning.config.checks reads them off the reader).
read_shapes.validation_metrics = SHAPES_METRICS


def ensure_shapes(config: Config) -> None:
    """The embedded default makes its own data: `python train.py` works on a fresh clone. Called by
    the commands that train or prepare (captioning/cli), never by a reader: reading data never writes it."""
    d = config.data
    root = Path(d.root)
    if d.dataset == "shapes" and not (root / d.split_file).exists():
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
