"""Annotations of equal norm (model.extras.unit_annotations; not in the paper).

Every annotation is rescaled to norm sqrt(D) before attention sees it. Cells on an object can have
a larger norm than background cells, so a sampled object cell jolts a young decoder more than a
background cell, and REINFORCE can learn to avoid objects; with equal norms a cell is worth
sampling for what it says, not how loudly.

Seam: what attention sees of the annotations (SoftAttention / HardAttention `inputs`).
Notation: B batch, L grid cells, D annotation channels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class UnitAnnotations(nn.Module):
    channels = 0  # appends nothing

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        return F.normalize(annotations, dim=2) * math.sqrt(annotations.shape[2])  # [B, L, D]
