"""Attention over the annotation grid: a *score* function and a way of *using* the weights.

Notation: B batch, L grid cells, D annotation channels, H decoder hidden size, A attention size.

The score says how well each cell a_i matches the decoder state, e_ti = score(h_{t-1}, a_i)
(Eq. 4); alpha_t = softmax(e_t) (Eq. 5). Soft attention takes the expectation of the annotations
under alpha (Sec. 4.2); hard attention (Sec. 4.1) will sample one cell. Both return the same
AttentionOutput, so the decoder never asks which kind it holds.

Whatever depends only on the image (e.g. W_a a_i in the additive score) is computed once per image
in `prepare`, not once per word: it is the largest tensor in the step, and recomputing it every
step is where the popular ports lose most of their time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Memory:
    """What attention needs of one batch of images, computed once per image."""

    annotations: torch.Tensor  # [B, L, D]
    keys: torch.Tensor  # [B, L, A], the score's image-side projection

    def select(self, index: torch.Tensor) -> Memory:
        """Rows of the batch, e.g. each image repeated once per beam."""
        return Memory(self.annotations.index_select(0, index), self.keys.index_select(0, index))

    def prefix(self, rows: int) -> Memory:
        """The first `rows` images, as views (no copy): the rows still running when sorted by length."""
        return Memory(self.annotations[:rows], self.keys[:rows])


@dataclass
class AttentionOutput:
    context: torch.Tensor  # [B, D], z_t before the gate
    alpha: torch.Tensor  # [B, L], the attention weights
    log_prob: torch.Tensor | None = None  # [B], log p(s_t | a) of a sampled location (hard only)
    entropy: torch.Tensor | None = None  # [B], H[alpha_t] (hard only)


class AdditiveScore(nn.Module):
    """Bahdanau's score, the paper's f_att: e_ti = v^T tanh(W_a a_i + W_h h_{t-1})."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int):
        super().__init__()
        self.key = nn.Linear(annotation_dim, attention_dim)  # W_a (and the bias)
        self.query = nn.Linear(hidden_dim, attention_dim, bias=False)  # W_h
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def prepare(self, annotations: torch.Tensor) -> torch.Tensor:
        return self.key(annotations)  # [B, L, A], once per image

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = self.query(hidden)  # [B, A]
        return self.v(torch.tanh(keys + query[:, None, :])).squeeze(2)  # [B, L]


class SoftAttention(nn.Module):
    """Deterministic soft attention (Sec. 4.2): z_t = sum_i alpha_ti a_i."""

    def __init__(self, score: nn.Module):
        super().__init__()
        self.score = score

    def prepare(self, annotations: torch.Tensor) -> Memory:
        return Memory(annotations=annotations, keys=self.score.prepare(annotations))

    def forward(self, memory: Memory, hidden: torch.Tensor) -> AttentionOutput:
        alpha = torch.softmax(self.score(memory.keys, hidden), dim=1)  # [B, L], Eq. 5
        context = torch.bmm(alpha[:, None, :], memory.annotations).squeeze(1)  # [B, D], Eq. 13
        return AttentionOutput(context=context, alpha=alpha)


SCORES: dict[str, type[nn.Module]] = {"additive": AdditiveScore}
ATTENTION: dict[str, type[nn.Module]] = {"soft": SoftAttention}


def build_attention(*, kind: str = "soft", score: str = "additive", annotation_dim: int, hidden_dim: int,
                    attention_dim: int) -> nn.Module:
    if score not in SCORES:
        raise ValueError(f"unknown attention score '{score}' (known: {', '.join(SCORES)})")
    if kind not in ATTENTION:
        raise ValueError(f"unknown attention kind '{kind}' (known: {', '.join(ATTENTION)})")
    scorer = SCORES[score](annotation_dim=annotation_dim, hidden_dim=hidden_dim, attention_dim=attention_dim)
    return ATTENTION[kind](scorer)
