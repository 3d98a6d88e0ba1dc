"""A second glimpse per word (model.extras.glimpses: 2; not in the paper).

"A to the left of B" is decided at the word "to", before B is named, and a single map at that word
would have to cover both A and B. A second soft attention, queried with the query and what the
first glimpse saw, [q_t; z_t], can look *elsewhere*; z_t is then both contexts side by side, and
with the grid coordinates appended (position.py) it holds both places.

The map reported for the word (overlays, attention correctness, the doubly stochastic term) is the
mean of the two glimpses' maps: still a distribution over the L cells, as the maps of several
attention heads are often averaged to show them. Which glimpse looks at the object being named is
not fixed by the architecture, so neither glimpse's map alone would show where the decoder looked
on every trained model. Each glimpse's own map is what `first` and `second` return (forward hooks).

Seam: the decoder's `attention` (one interface: start, forward, context_dim).
Notation: B batch, L grid cells, D annotation channels (+ appended ones).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from captioning.model.paper import AttentionOutput, Draws, Memory


@dataclass
class GlimpsesMemory:
    """Each glimpse's own memory of one batch of images."""

    first: Memory
    second: Memory

    def select(self, index: torch.Tensor) -> GlimpsesMemory:
        return GlimpsesMemory(self.first.select(index), self.second.select(index))

    def prefix(self, rows: int) -> GlimpsesMemory:
        return GlimpsesMemory(self.first.prefix(rows), self.second.prefix(rows))


class TwoGlimpses(nn.Module):
    """z_t = [z_t; z'_t] with z'_t = second(a, [q_t; z_t]); the reported map is (alpha_t + alpha'_t) / 2."""

    def __init__(self, first: nn.Module, second: nn.Module):
        super().__init__()
        self.first = first
        self.second = second  # soft attention whose query is [q_t; z_t]

    def context_dim(self, annotation_dim: int) -> int:
        return self.first.context_dim(annotation_dim) + self.second.context_dim(annotation_dim)

    def start(self, annotations: torch.Tensor, draws: Draws | None = None) -> GlimpsesMemory:
        """`draws` (hard attention while training) go to the first glimpse: the second is soft."""
        return GlimpsesMemory(self.first.start(annotations, draws=draws), self.second.start(annotations))

    def forward(self, memory: GlimpsesMemory, query: torch.Tensor) -> AttentionOutput:
        first = self.first(memory.first, query)
        second = self.second(memory.second, torch.cat([query, first.context], dim=1))
        return replace(first, context=torch.cat([first.context, second.context], dim=1),  # [B, 2D]
                       alpha=(first.alpha + second.alpha) / 2)  # [B, L], the reported map
