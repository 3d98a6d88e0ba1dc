"""(image, caption) training pairs over cached annotations, and the batch collation.

Notation: B batch, T caption tokens (<start> .. <end>), L grid cells, D channels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from captioning.data.karpathy import ImageRecord
from captioning.vocab import Vocabulary, tokenize


@dataclass
class Batch:
    annotations: torch.Tensor  # [B, L, D] float32
    tokens: torch.Tensor  # [B, T] <start> w1 .. wn <end> <pad> ..
    lengths: torch.Tensor  # [B] tokens including <start> and <end>

    def to(self, device: str | torch.device) -> Batch:
        return Batch(self.annotations.to(device), self.tokens.to(device), self.lengths.to(device))


class CaptionPairs(Dataset):
    """Every (image, reference caption) pair of a split; item = (annotations [L, D], token ids)."""

    def __init__(self, annotations: np.ndarray, records: list[ImageRecord], vocab: Vocabulary, *,
                 max_length: int | None = None):
        self.annotations = annotations  # [N, L, D] fp16, possibly memory-mapped
        self.pairs = [(i, vocab.encode(tokenize(caption), max_length))
                      for i, record in enumerate(records) for caption in record.captions]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, list[int]]:
        image, tokens = self.pairs[index]
        return torch.from_numpy(np.asarray(self.annotations[image], dtype=np.float32)), tokens


def collate(items: list[tuple[torch.Tensor, list[int]]]) -> Batch:
    lengths = torch.tensor([len(tokens) for _, tokens in items])
    tokens = torch.full((len(items), int(lengths.max())), Vocabulary.pad_id, dtype=torch.long)  # [B, T]
    for row, (_, ids) in enumerate(items):
        tokens[row, : len(ids)] = torch.tensor(ids)
    return Batch(annotations=torch.stack([a for a, _ in items]), tokens=tokens, lengths=lengths)
