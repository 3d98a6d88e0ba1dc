"""A learned window for the local score (model.local.window: learned; not in Luong or the paper).

The local score (captioning.model.scores.LocalScore) multiplies a Gaussian window around a
predicted centre p_t into the weights. A Gaussian times any exp(linear) is another Gaussian, so the
plain window can only move. This adds a learned shape around the centre, chosen by the state:

  e_ti += w_s^T tanh(W_s (c_i - p_t) / sigma + U_s h_{t-1})

which can be a half-plane or a cone, e.g. "below the centre": centred on A, such a map asks whether
anything lies below A, which deciding a relation among three objects needs. w_s starts at zero, so
the score starts as the plain local one.

Seam: the attention's score. Notation: B batch, L grid cells, H query size.
"""

from __future__ import annotations

import torch
from torch import nn

from captioning.config.registry import LOCAL_WINDOWS
from captioning.model.scores import LocalScore


@LOCAL_WINDOWS.register("learned")
class LearnedWindowScore(LocalScore):
    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None, base: str = "additive", sigma: float | None = None,
                 base_options: dict | None = None):
        super().__init__(annotation_dim=annotation_dim, hidden_dim=hidden_dim, attention_dim=attention_dim, grid=grid,
                         base=base, sigma=sigma, base_options=base_options)
        units = attention_dim // 4  # a shape on a 2-D offset needs few units
        self.shape = nn.ModuleDict({"offset": nn.Linear(2, units),  # W_s
                                    "query": nn.Linear(hidden_dim, units, bias=False),  # U_s
                                    "out": nn.Linear(units, 1, bias=False)})  # w_s
        nn.init.zeros_(self.shape["out"].weight)

    def forward(self, keys: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
        offset = self.offset(hidden)  # [B, L, 2]
        units = torch.tanh(self.shape["offset"](offset / self.sigma) + self.shape["query"](hidden)[:, None])
        return self.window_scores(keys, hidden, offset) + self.shape["out"](units).squeeze(2)  # [B, L]
