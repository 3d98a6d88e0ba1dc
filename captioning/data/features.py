"""The annotation cache: a frozen encoder's output, computed once per image and stored as fp16.

Notation: N images, L grid cells, D channels.

With a frozen encoder the annotations of an image never change, so recomputing them every epoch
is pure waste: the cache makes an epoch a decoder-only pass. Each split is one .npy array
[N, L, D] (memory-mapped when read, so it need not fit in RAM) plus a small JSON naming the image
ids, the grid and the encoder that produced it; a cache made by another encoder is recomputed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from captioning.data.images import load_image, to_tensor
from captioning.data.karpathy import ImageRecord
from captioning.encoder import Encoder


class ImageFiles(Dataset):
    """Normalized encoder input for a list of image records."""

    def __init__(self, records: list[ImageRecord], *, size: int, mean: tuple[float, ...], std: tuple[float, ...]):
        self.records, self.size, self.mean, self.std = records, size, mean, std

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> torch.Tensor:
        return to_tensor(load_image(self.records[index].path), size=self.size, mean=self.mean, std=self.std)


@torch.no_grad()
def compute_annotations(encoder: Encoder, records: list[ImageRecord], *, image_size: int, batch_size: int = 32,
                        device: str | torch.device = "cpu", num_workers: int = 0,
                        description: str = "features") -> tuple[np.ndarray, tuple[int, int]]:
    """Annotations [N, L, D] as fp16, with the grid (Hg, Wg)."""
    images = ImageFiles(records, size=image_size, mean=encoder.mean, std=encoder.std)
    loader = DataLoader(images, batch_size=batch_size, num_workers=num_workers)
    encoder = encoder.to(device).eval()
    grid: tuple[int, int] = (0, 0)
    out: np.ndarray | None = None
    start = 0
    for batch in tqdm(loader, desc=description, unit="batch", leave=False, disable=None):
        annotations, grid = encoder(batch.to(device))  # [b, L, D]
        annotations = annotations.to(torch.float16).cpu().numpy()
        if out is None:
            out = np.empty((len(records), *annotations.shape[1:]), dtype=np.float16)
        out[start:start + len(annotations)] = annotations
        start += len(annotations)
    return out, grid


def cache_dir(root: str | Path, *, encoder: str, layer: str, image_size: int, weights_path: str | None) -> Path:
    tag = f"{encoder}-{layer}-{image_size}" + ("" if weights_path is None else f"-{Path(weights_path).stem}")
    return Path(root) / "features" / tag


def load_or_compute(directory: Path, split: str, records: list[ImageRecord], *, encoder_factory, image_size: int,
                    batch_size: int = 32, device: str | torch.device = "cpu") -> tuple[np.ndarray, tuple[int, int]]:
    """The cached annotations of a split (memory-mapped), computing and storing them if needed.

    `encoder_factory()` builds the encoder only when something must be computed. The array is
    written under a temporary name and renamed, so an interrupted run never leaves a cache that
    looks complete.
    """
    array_path, meta_path = directory / f"{split}.npy", directory / f"{split}.json"
    ids = [r.image_id for r in records]
    if array_path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("image_ids") == ids:
            return np.load(array_path, mmap_mode="r"), tuple(meta["grid"])
    directory.mkdir(parents=True, exist_ok=True)
    encoder = encoder_factory()
    annotations, grid = compute_annotations(encoder, records, image_size=image_size, batch_size=batch_size,
                                            device=device, description=f"{split} features")
    temporary = array_path.with_suffix(".tmp.npy")
    np.save(temporary, annotations)
    os.replace(temporary, array_path)
    meta_path.write_text(json.dumps({"image_ids": ids, "grid": list(grid), "shape": list(annotations.shape)}))
    return np.load(array_path, mmap_mode="r"), grid
