"""What attention is queried with at step t: the paper's q_t = h_{t-1} (Eq. 4).

A seam of the decoder (captioning.model.decoder): a query module takes the decoder's state and the
previous word's embedding, and gives the query and the state, where it may carry something of its
own from word to word. The other queries are extras: h_{t-1} with the previous word
(captioning/model/extras/query_word.py), and with what self-attention recalls of the words said so
far (captioning/model/extras/word_attention.py). The fused recurrence (captioning.model.fused)
computes the paper's query only.
"""

from __future__ import annotations

import torch
from torch import nn

from captioning.model.state import DecoderState


class PreviousState(nn.Module):
    """The paper's attention query: q_t = h_{t-1} (Eq. 4)."""

    @staticmethod
    def dim(*, hidden_dim: int, embed_dim: int) -> int:
        return hidden_dim

    def forward(self, state: DecoderState, embedded: torch.Tensor) -> tuple[torch.Tensor, DecoderState]:
        return state.h, state  # [B, H]
