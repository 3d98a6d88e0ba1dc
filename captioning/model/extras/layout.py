"""The layout in the initial state (model.extras.init: layout; not in the paper).

The paper computes h_0 and c_0 from the mean annotation (Sec. 3.1.2). The mean is the same for any
permutation of the cells: it says what is in the image, not where. A caption "A <relation> B" names
the relation before it names B, so a decoder that has not yet looked at B needs the layout in its
state. This summary adds to the mean a small projection of every cell, in grid order.

Seam: the decoder's `summary` (captioning.model.paper.MeanAnnotation is the paper's).
Notation: B batch, L grid cells, D annotation channels.
"""

from __future__ import annotations

import torch
from torch import nn


class LayoutSummary(nn.Module):
    """[mean_i a_i; W a_1; ...; W a_L]: the mean annotation and each cell projected to `layout_dim`."""

    def __init__(self, *, annotation_dim: int, cells: int, layout_dim: int = 8):
        super().__init__()
        self.layout = nn.Linear(annotation_dim, layout_dim)
        self.cells = cells
        self.dim = annotation_dim + cells * layout_dim  # what f_init,h and f_init,c read

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        if annotations.shape[1] != self.cells:
            raise ValueError(f"the layout summary was built for {self.cells} grid cells, got annotations with "
                             f"{annotations.shape[1]}")
        return torch.cat([annotations.mean(dim=1), self.layout(annotations).flatten(1)], dim=1)  # [B, D + L * 8]
