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
