"""One split of a dataset, ready for the decoder: its images, references, cached annotations and,
where the dataset has them, the object boxes that attention is scored against."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from captioning.config import Config
from captioning.data.features import cache_dir, load_or_compute
from captioning.data.karpathy import DatasetError, ImageRecord, read_split
from captioning.data.shapes import SHAPES_DEFAULT_COUNTS, Grounding, make_shapes, read_grounding
from captioning.encoder import build_encoder


@dataclass
class Split:
    name: str
    records: list[ImageRecord]
    annotations: np.ndarray  # [N, L, D] fp16, memory-mapped
    grid: tuple[int, int]  # (Hg, Wg), L = Hg * Wg
    grounding: list[Grounding] | None  # per image, for attention correctness

    @property
    def image_ids(self) -> list[int]:
        return [r.image_id for r in self.records]

    @property
    def references(self) -> list[tuple[str, ...]]:
        return [r.captions for r in self.records]


def load_splits(config: Config, names: tuple[str, ...], *, device: str | torch.device = "cpu") -> dict[str, Split]:
    """The named splits, computing any missing annotation cache with one shared encoder."""
    d, e = config.data, config.encoder
    if d.dataset != "shapes" and d.dataset != "karpathy":
        raise DatasetError(f"unknown dataset '{d.dataset}' (known: shapes, karpathy)")
    root = Path(d.root)
    directory = cache_dir(root, encoder=e.name, layer=e.layer, image_size=d.image_size, weights_path=e.weights_path)
    encoder = functools.cache(lambda: build_encoder(name=e.name, layer=e.layer, weights_path=e.weights_path))
    if d.dataset == "shapes" and not (root / d.split_file).exists():
        # The embedded default makes its own data: `python train.py` works on a fresh clone.
        print(f"{root / d.split_file} not found: generating the shapes dataset there", file=sys.stderr)
        make_shapes(root, dict(SHAPES_DEFAULT_COUNTS), image_size=d.image_size)
    objects = root / "objects.json"
    splits = {}
    for name in names:
        records = read_split(root / d.split_file, name)
        annotations, grid = load_or_compute(directory, name, records, encoder_factory=encoder,
                                            image_size=d.image_size, batch_size=e.batch_size, device=device)
        grounding = read_grounding(objects, [r.image_id for r in records]) if objects.exists() else None
        splits[name] = Split(name, records, annotations, grid, grounding)
    return splits
