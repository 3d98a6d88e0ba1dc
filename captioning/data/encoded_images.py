"""Annotations computed on demand, for an encoder that trains (encoder.fine_tune_from) and so cannot be
cached: where a frozen encoder's annotations come from the feature cache (data/features.py), a
fine-tuned one's come from here, read like the cached array: from the image files (EncodedImages),
or from the cache of its frozen stages' output (EncodedCells, encoder.cache_frozen)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from captioning.data.images import ImageFiles, ImageReadError, collate_pixels, warn_unreadable
from captioning.data.records import ImageRecord
from captioning.model.encoder import Encoder


class EncodedImages:
    """Annotations computed on demand from image files, for an encoder that is not frozen (so cannot
    be cached): encoded[a:b] runs the encoder on those images -> [b - a, L, D] float32. Reads like the
    cached array wherever a split is decoded. An unreadable image gives a row of zeros, is named once
    and its row goes into `unreadable`, which evaluation leaves out of the metrics."""

    def __init__(self, encoder: Encoder, records: list[ImageRecord], *, image_size: int,
                 device: str | torch.device = "cpu"):
        self.encoder, self.records, self.image_size, self.device = encoder, records, image_size, device
        self.offset = 0  # where these records start among the named rows' (a part of a larger split)
        self.named: set[int] = set()  # rows whose image could not be read, counted from the split's start

    def __len__(self) -> int:
        return len(self.records)

    @property
    def unreadable(self) -> set[int]:
        """Rows of this one (from 0) whose image could not be read."""
        return {row - self.offset for row in self.named if 0 <= row - self.offset < len(self.records)}

    def part(self, start: int, stop: int) -> EncodedImages:
        """Images start .. stop, still encoded on demand (a slice would encode them all at once),
        sharing this one's record of unreadable rows, so that each is named once in a run."""
        view = EncodedImages(self.encoder, self.records[start:stop], image_size=self.image_size, device=self.device)
        view.offset, view.named = self.offset + start, self.named
        return view

    @torch.no_grad()
    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("EncodedImages takes slices, e.g. encoded[0:100]")
        images = ImageFiles(self.records[key], size=self.image_size, mean=self.encoder.mean, std=self.encoder.std)
        batch = collate_pixels([images[i] for i in range(len(images))])
        first = self.offset + (key.start or 0)
        for row, reason in batch.failures:
            if first + row not in self.named:
                warn_unreadable(reason)
                self.named.add(first + row)
        if batch.pixels is None:
            raise ImageReadError(f"none of the images {key.start}..{key.stop} could be read")
        was_training = self.encoder.training
        self.encoder.eval()
        annotations, _ = self.encoder(batch.pixels.to(self.device))  # [b, L, D]
        self.encoder.train(was_training)
        out = np.zeros((len(images), *annotations.shape[1:]), dtype=np.float32)
        out[batch.rows] = annotations.float().cpu().numpy()
        return out


class EncodedCells:
    """Annotations computed on demand from the cached output of a fine-tuned encoder's frozen stages
    (encoder.cache_frozen): encoded[a:b] runs the stages that train (in eval mode) on those rows ->
    [b - a, L, D] float32. Reads like the cached array wherever a split is decoded; `part` stays on
    demand (a slice would encode them all at once)."""

    def __init__(self, encoder: Encoder, cells: Any, *, device: str | torch.device = "cpu"):
        self.encoder, self.cells, self.device = encoder, cells, device  # cells: [N, Lf, Df], the cache's rows

    def __len__(self) -> int:
        return len(self.cells)

    def part(self, start: int, stop: int) -> EncodedCells:
        return EncodedCells(self.encoder, self.cells[start:stop], device=self.device)

    @torch.no_grad()
    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("EncodedCells takes slices, e.g. encoded[0:100]")
        cells = torch.from_numpy(np.array(self.cells[key])).to(self.device).float()  # [b, Lf, Df]
        was_training = self.encoder.training
        self.encoder.eval()
        annotations, _ = self.encoder(cells)  # [b, L, D]
        self.encoder.train(was_training)
        return annotations.float().cpu().numpy()
