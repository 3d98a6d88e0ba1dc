"""The decoder's state from word to word: h and c of the LSTM (Eqs. 1-3), and whatever its query
module carries of the caption so far (captioning.model.paper.PreviousState, the paper's, carries nothing).

Notation: B batch (rows: images, or beams), H hidden size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class Carried(Protocol):
    """What a query module keeps of the caption so far (e.g. self-attention's keys and values,
    captioning/model/extras/word_attention.py): rows of the batch like h and c."""

    def select(self, index: torch.Tensor) -> Carried: ...

    def prefix(self, rows: int) -> Carried: ...

    @classmethod
    def cat(cls, parts: Sequence[Carried]) -> Carried: ...


@dataclass
class DecoderState:
    h: torch.Tensor  # [B, H]
    c: torch.Tensor  # [B, H]
    carried: Carried | None = None  # the query's own (the paper's keeps nothing)

    def select(self, index: torch.Tensor) -> DecoderState:
        """Rows of the batch, e.g. the beams to continue from: what the query carries goes with them."""
        carried = None if self.carried is None else self.carried.select(index)
        return DecoderState(self.h.index_select(0, index), self.c.index_select(0, index), carried)

    def prefix(self, rows: int) -> DecoderState:
        """The first `rows` rows, as views: the rows still running when sorted by length."""
        carried = None if self.carried is None else self.carried.prefix(rows)
        return DecoderState(self.h[:rows], self.c[:rows], carried)

    @classmethod
    def cat(cls, states: Sequence[DecoderState]) -> DecoderState:
        """The rows of several states, one after another."""
        carried = [s.carried for s in states]
        joined = None if carried[0] is None else type(carried[0]).cat(carried)
        return cls(torch.cat([s.h for s in states]), torch.cat([s.c for s in states]), joined)

    @property
    def word_alphas(self) -> torch.Tensor | None:
        """[B, t]: how the last query weighed the words said so far, where the query attends over them."""
        return getattr(self.carried, "weights", None)
