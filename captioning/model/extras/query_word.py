"""The previous word in the attention query (model.extras.query_word; not in the paper).

In Eq. 4 the map for y_t is computed from h_{t-1}, the state that predicted y_{t-1}, before that
word was chosen: after "a red" the map for the next word comes from a state that weighed "red"
against "yellow" but does not know which was said, so with a red and a yellow square in the image
the map for "square" cannot look for the red one. Querying with [h_{t-1}; E y_{t-1}] lets it, as
the attention LSTM of Anderson et al. (2018) reads the previous word before it attends.

Seam: the decoder's `query` (captioning.model.paper.PreviousState is the paper's).
Notation: B batch, H hidden size, E embedding size.
"""

from __future__ import annotations

import torch
from torch import nn

from captioning.model.state import DecoderState


class WordInQuery(nn.Module):
    """q_t = [h_{t-1}; E y_{t-1}]."""

    @staticmethod
    def dim(*, hidden_dim: int, embed_dim: int) -> int:
        return hidden_dim + embed_dim

    def forward(self, state: DecoderState, embedded: torch.Tensor) -> tuple[torch.Tensor, DecoderState]:
        return torch.cat([state.h, embedded], dim=1), state  # [B, H + E]
