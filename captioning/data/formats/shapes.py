"""The shapes data (captioning.data.shapes): scenes the project draws, in a Karpathy-style split file."""

from __future__ import annotations

from captioning.config import DataConfig
from captioning.config.registry import DATASETS
from captioning.data.formats.karpathy import read_split
from captioning.data.records import ImageRecord, data_root


@DATASETS.register("shapes")
def read_shapes(data: DataConfig, split: str) -> list[ImageRecord]:
    """One split of data.root/data.split_file, which `captioning make-shapes` writes."""
    root = data_root(data, where=f"`captioning make-shapes --out {data.root}` makes it")
    return read_split(root / data.split_file, split, image_root=root / data.image_dir)
