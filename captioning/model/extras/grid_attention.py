"""Self-attention over the grid (model.extras.grid_attention; not in the paper).

Each annotation a_i attends to every cell of its image before the decoder sees them, with the
attention family's last member, the scaled dot product over queries, keys and values
(q = W_q^T a, k = W_k^T a, v = W_v^T a; Z = V softmax(Q^T K / sqrt(p))), in several heads, and
adds what it gathers to itself: a_i + W_o [z_i^1; ..; z_i^n]. A CNN cell knows its own receptive
field; after this it also knows what else is in the image, e.g. that the square it shows has a
circle to its left, which "to the left of" needs.

Why several heads: one head gives each cell one weighted average, so one relation at a time (its
neighbours, or the other object); n heads of D/n channels each gather n at once for the same
products (Vaswani et al., 2017). Why the residual with W_o starting at zero: the model starts as
the paper's (a_i unchanged), and what the heads add is learned from there; the annotations keep
what the pretrained CNN put in them, which the paper's model reads.

Seam: what attention sees of the annotations (SoftAttention / HardAttention `inputs`), so it works
with every score and both kinds of attention; it runs once per image in `start`, before the
recurrence, so soft additive attention keeps its fused path (captioning.model.fused).
Notation: B batch, L grid cells, D annotation channels, n heads, p = D / n.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class GridSelfAttention(nn.Module):
    """a_i + W_o MultiHead(a)_i over the cells of each image."""

    channels = 0  # adds, appends nothing

    def __init__(self, *, annotation_dim: int, heads: int):
        super().__init__()
        if heads < 1 or annotation_dim % heads:
            raise ValueError(f"model.extras.grid_attention={heads} heads must divide the {annotation_dim} "
                             "annotation channels")
        self.heads, self.key_dim = heads, annotation_dim // heads
        self.qkv = nn.Linear(annotation_dim, 3 * annotation_dim, bias=False)  # W_q, W_k, W_v of every head
        self.out = nn.Linear(annotation_dim, annotation_dim, bias=False)  # W_o
        nn.init.zeros_(self.out.weight)  # starts as the identity: the paper's annotations

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        batch, cells, dim = annotations.shape
        q, k, v = self.qkv(annotations).view(batch, cells, 3, self.heads, self.key_dim).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.key_dim), dim=-1)  # [B, n, L, L]
        gathered = (weights @ v).transpose(1, 2).reshape(batch, cells, dim)  # [B, L, D], the heads side by side
        return annotations + self.out(gathered)  # [B, L, D]
