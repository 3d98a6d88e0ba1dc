"""Training losses: word cross-entropy and the doubly stochastic attention term (Eq. 14).

Notation: B batch, T caption steps, L grid cells, V vocabulary size. `mask` [B, T] is 1 on real
target words (including <end>) and 0 on padding; padding reaches neither term.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood per real target word. logits [B, T, V], targets/mask [B, T]."""
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)  # [B, T]
    return (nll * mask).sum() / mask.sum()


def doubly_stochastic(alphas: torch.Tensor, mask: torch.Tensor, *, target: str = "one") -> torch.Tensor:
    """sum_i (tau - sum_t alpha_ti)^2, summed over cells i, averaged over images (Eq. 14).

    The paper's tau = 1 asks every cell to receive a total weight of 1 over the caption. A caption of
    T words carries a total weight of exactly T, so with T < L the paper's target cannot be met and
    the term spreads the maps out; `target="length"` uses tau = T/L, the target that can be met.
    """
    mask = mask.to(alphas.dtype)
    totals = (alphas * mask[:, :, None]).sum(dim=1)  # [B, L], sum_t alpha_ti over real steps
    if target == "one":
        tau = torch.ones_like(totals)
    elif target == "length":
        tau = (mask.sum(dim=1, keepdim=True) / alphas.shape[2]).expand_as(totals)  # [B, L], T_b / L
    else:
        raise ValueError(f"unknown doubly stochastic target '{target}' (known: one, length)")
    return ((tau - totals) ** 2).sum(dim=1).mean()
