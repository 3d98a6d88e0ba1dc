"""Hard attention whose samples are given, for tests and studies that must know every sample: the
exact gradient of the variational bound by enumerating every location sequence of a small problem
(tests/train/test_reinforce.py, studies/reinforce_variance). Not for training: the package
samples its own (captioning.model.paper.HardAttention)."""

from __future__ import annotations

import torch
from torch import nn

from captioning.model.paper import HardAttention, Memory


class GivenLocations(HardAttention):
    """Hard attention whose "samples" are given: row n takes cell sequences[n, t] at step t.

    For analysis rather than training: it enumerates every location sequence of a small problem
    (the exact gradient of the bound, Sec. 4.1) or replays the same samples in another batch layout.
    Rows are taken in the order given, every row at every step: run the decoder's teacher-forced
    forward without `lengths` (which would sort the rows and drop finished ones).
    """

    def __init__(self, score: nn.Module, sequences: torch.Tensor):
        super().__init__(score, expectation_prob=0.0)
        self.sequences = sequences  # [B, T] long

    def _choose(self, alpha: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        cell = self.sequences[:, memory.t]  # [B]
        memory.t += 1
        return cell, torch.zeros_like(cell, dtype=torch.bool)
