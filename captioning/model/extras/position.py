"""2-D position in the annotations (model.extras.position; not in the paper).

Deep CNN features say *what* is in a cell far better than *where* the cell is, and a soft context
z_t = sum_i alpha_ti a_i knows where it looked only as far as the vectors a_i say so. Spatial
words ("to the left of") need it. Two ways:

- "learned" (GridPosition): a learned position added to every annotation, a_i + r_row(i) + c_col(i);
- "coordinates" (GridCoordinates): each cell's centre (x, y) appended as two channels.

Seam: what attention sees of the annotations (SoftAttention / HardAttention `inputs`).
Notation: B batch, L grid cells (Hg x Wg), D annotation channels.
"""

from __future__ import annotations

import torch
from torch import nn

from captioning.model.scores import check_cells


class GridPosition(nn.Module):
    """a_i + r_row(i) + c_col(i), learned."""

    channels = 0  # adds, appends nothing

    def __init__(self, *, grid: tuple[int, int], annotation_dim: int):
        super().__init__()
        self.rows = nn.Parameter(0.02 * torch.randn(grid[0], annotation_dim))  # [Hg, D]
        self.columns = nn.Parameter(0.02 * torch.randn(grid[1], annotation_dim))  # [Wg, D]

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        position = (self.rows[:, None, :] + self.columns[None, :, :]).flatten(0, 1)  # [L, D]
        check_cells(annotations, position.shape[0], "2-D position of the")
        return annotations + position  # [B, L, D]


class GridCoordinates(nn.Module):
    """Two channels appended to every annotation: the centre (x, y) of its cell, in [-1, 1].

    Unlike a position *added* to the features, the coordinates stay separable from the content and
    average as coordinates do: under soft attention the context's last two channels are the centre of
    mass of the map, sum_i alpha_ti (x_i, y_i), and under hard attention the chosen cell's centre,
    both times the image's scale below (and the gate beta_t, in z_t). They are scaled by each image's
    root-mean-square annotation channel (not learned, not a batch statistic), so they are as loud as an
    average channel whatever the backbone.
    """

    channels = 2  # the annotations become D + 2 wide

    def __init__(self, *, grid: tuple[int, int]):
        super().__init__()
        rows, columns = grid
        y = (torch.arange(rows) + 0.5) / rows * 2 - 1  # [Hg], cell centres in [-1, 1]
        x = (torch.arange(columns) + 0.5) / columns * 2 - 1  # [Wg]
        grid_y, grid_x = torch.meshgrid(y, x, indexing="ij")
        self.register_buffer("centres", torch.stack([grid_x, grid_y], dim=2).flatten(0, 1), persistent=False)  # [L, 2]

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        check_cells(annotations, self.centres.shape[0], "2-D coordinates of the")
        scale = annotations.pow(2).mean(dim=(1, 2)).sqrt()  # [B], the image's RMS channel
        centres = self.centres.to(annotations.dtype)[None] * scale[:, None, None]  # [B, L, 2]
        return torch.cat([annotations, centres], dim=2)  # [B, L, D + 2]
