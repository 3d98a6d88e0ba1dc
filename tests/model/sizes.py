"""The sizes the attention tests share, and their random inputs.

B images, a GRID of L cells, D annotation channels, H hidden size, A attention size, V vocabulary.
"""

from __future__ import annotations

import torch

B, GRID, D, H, A, V = 2, (3, 3), 8, 16, 8, 11
L = GRID[0] * GRID[1]


def inputs(seed: int = 1, *, batch: int = B, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Annotations [batch, L, D] and a hidden state [batch, H], drawn in that order from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    annotations = torch.randn(batch, L, D, generator=generator, dtype=dtype)
    return annotations, torch.randn(batch, H, generator=generator, dtype=dtype)


def model_section(*overrides: str):
    """A `model:` section at the tests' attention size A, with `key=value` overrides of model.* (e.g.
    "score=local", "extras.position=coordinates"); checked as a config file would be."""
    from captioning.config import load_config

    return load_config(None, [f"model.attention_dim={A}", *(f"model.{text}" for text in overrides)]).model


def make_attention(*overrides: str, query_dim: int = H, grid: tuple[int, int] | None = GRID, annotation_dim: int = D,
                   kind: str | None = None):
    """Attention as captioning.model.encoder_decoder builds it from model_section(*overrides)."""
    from captioning.model.encoder_decoder import build_attention

    return build_attention(model_section(*overrides), annotation_dim=annotation_dim, query_dim=query_dim, grid=grid,
                           kind=kind)
