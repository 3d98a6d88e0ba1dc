"""Self-attention over the words said so far (model.extras.word_attention; not in the paper).

Intra-attention (Cheng, Dong & Lapata, 2016, "Long Short-Term Memory-Networks for Machine
Reading"), as the attention family's notes end with it: each word has a query, a key and a value,
q = W_q^T x, k = W_k^T x, v = W_v^T x, and a word's new representation is the softmax of its
query's scaled dot products with the keys of the words before it, Z = V softmax(Q^T K / sqrt(p)).
Causal: a word attends to the words said before it, never to later ones.

In the paper's terms: at step t, the word x is the decoder's state. The query comes from h_{t-1}
(the state attention is queried with, Eq. 4); the keys and values from h_0 .. h_{t-1}, where h_0
stands for <start> and h_j for word j (the state that output y_j). The recalled s_t = sum_j w_tj v_j
joins the attention query, q_t = [h_{t-1}; s_t] (any other query before it, e.g. the previous
word's: model.extras.query_word), and the keys and values are carried in the decoder's state, one
row per image or beam (beam search reorders them with the beams).

Three choices, and why:
- The states, not the words' embeddings: an embedding says which word was said, not what it was
  about. In "a red square to the left of a blue square" both squares have one embedding; h_j knows
  which object it was describing and where attention looked for it (z_j went into it).
- Into the attention query, not the output layer: what was said should be able to move where the
  model looks next (after "a red circle to the left of a", the other object); in the output layer
  it could change the word chosen, never the map.
- h_{t-1} is among its own keys: the weight a state gives itself says how much the earlier words
  matter against the present one, and the first word (which has only h_0) has something to attend.

Notation: B rows, t the states so far, H hidden size, p the key size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from captioning.model.state import DecoderState


@dataclass
class SaidSoFar:
    """The keys and values of h_0 .. h_{t-1}, and how the last query weighed them."""

    keys: torch.Tensor  # [B, t, p]
    values: torch.Tensor  # [B, t, p]
    valid: torch.Tensor  # [B, t] bool: False where rows of different lengths were put together (`cat`)
    weights: torch.Tensor  # [B, t], w_{t-1, j}: the last query's softmax over the keys

    def parts(self) -> tuple[torch.Tensor, ...]:
        return self.keys, self.values, self.valid, self.weights

    def select(self, index: torch.Tensor) -> SaidSoFar:
        return SaidSoFar(*(part.index_select(0, index) for part in self.parts()))

    def prefix(self, rows: int) -> SaidSoFar:
        return SaidSoFar(*(part[:rows] for part in self.parts()))

    @classmethod
    def cat(cls, parts: Sequence[SaidSoFar]) -> SaidSoFar:
        """Rows of several captions, padded on the right to the longest (padding is never attended)."""
        longest = max(part.keys.shape[1] for part in parts)

        def padded(tensor: torch.Tensor, value: float | bool) -> torch.Tensor:
            pad = tensor.new_full((tensor.shape[0], longest - tensor.shape[1], *tensor.shape[2:]), value)
            return torch.cat([tensor, pad], dim=1)

        fills = (0.0, 0.0, False, 0.0)  # keys, values, valid, weights
        return cls(*(torch.cat([padded(part.parts()[i], fill) for part in parts]) for i, fill in enumerate(fills)))


class WordSelfAttention(nn.Module):
    """q_t = [base query; s_t], s_t = sum_j softmax_j(q . k_j / sqrt(p)) v_j over h_0 .. h_{t-1}."""

    def __init__(self, *, hidden_dim: int, key_dim: int, base: nn.Module):
        super().__init__()
        self.base = base  # the query it extends (the paper's h_{t-1}, or [h_{t-1}; E y_{t-1}])
        self.key_dim = key_dim
        self.q = nn.Linear(hidden_dim, key_dim, bias=False)  # W_q
        self.k = nn.Linear(hidden_dim, key_dim, bias=False)  # W_k
        self.v = nn.Linear(hidden_dim, key_dim, bias=False)  # W_v

    def dim(self, *, hidden_dim: int, embed_dim: int) -> int:
        return self.base.dim(hidden_dim=hidden_dim, embed_dim=embed_dim) + self.key_dim

    def forward(self, state: DecoderState, embedded: torch.Tensor) -> tuple[torch.Tensor, DecoderState]:
        h, said = state.h, state.carried  # h_{t-1} [B, H]; the keys and values of h_0 .. h_{t-2}
        key, value = self.k(h)[:, None], self.v(h)[:, None]  # [B, 1, p]
        valid = torch.ones_like(key[:, :, 0], dtype=torch.bool)  # [B, 1]
        if said is not None:
            key, value = torch.cat([said.keys, key], dim=1), torch.cat([said.values, value], dim=1)  # [B, t, p]
            valid = torch.cat([said.valid, valid], dim=1)
        scores = torch.einsum("bp,btp->bt", self.q(h), key) / math.sqrt(self.key_dim)  # q . k_j / sqrt(p)
        weights = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=1)  # [B, t]
        recalled = torch.einsum("bt,btp->bp", weights, value)  # s_t [B, p]
        query, state = self.base(state, embedded)
        carried = SaidSoFar(keys=key, values=value, valid=valid, weights=weights)
        return torch.cat([query, recalled], dim=1), dataclasses.replace(state, carried=carried)
