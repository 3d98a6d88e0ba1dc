"""What attention is queried with at step t: the paper's q_t = h_{t-1} (Eq. 4).

A seam of the decoder (captioning.model.decoder): the other query, h_{t-1} with the previous word,
is an extra (captioning/model/extras/query_word.py). The fused recurrence (captioning.model.fused)
computes the paper's query only.
"""

from __future__ import annotations

import torch
from torch import nn


class PreviousState(nn.Module):
    """The paper's attention query: q_t = h_{t-1} (Eq. 4)."""

    @staticmethod
    def dim(*, hidden_dim: int, embed_dim: int) -> int:
        return hidden_dim

    def forward(self, h: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return h  # [B, H]
