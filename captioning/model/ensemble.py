"""Several trained decoders decoded together, in one greedy or beam search (not in the paper).

An ensemble's next-word distribution is the mean of its members' probabilities:

    p(y_t | y_<t, a) = 1/M sum_m p_m(y_t | y_<t, a)

each member running its own recurrence (h, c, attention) over the same annotations a, fed the words
the search chose. The search sees one decoder whose step returns log p, so greedy, beam search, the
length penalty and the n-gram block work unchanged (captioning.model.decoding.stepper joins the
members' steps). A word's map is the mean of the members' maps. The members must read the same
annotations (one encoder, one grid) and index the same vocabulary; the caller checks both
(captioning.checkpoint.load_ensemble).

Notation: M members, N rows (images x beams), V words, L cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from captioning.model.state import DecoderState


class Ensemble(nn.Module):
    """Decoders whose word probabilities are averaged at every step (decoding only)."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least two decoders, got {len(members)}")
        self.members = nn.ModuleList(members)

    def forward(self, *args, **kwargs):
        raise TypeError("an ensemble decodes only (greedy or beam search); train its members one by one")


@dataclass
class EnsembleState:
    """Each member's own state, rows aligned: a beam's reordering moves them together."""

    members: list[DecoderState]

    @property
    def h(self) -> torch.Tensor:  # [N, H of the first member]: what a search reads of the rows' count and device
        return self.members[0].h

    @property
    def word_alphas(self) -> None:  # the members' self-attention over words is not averaged
        return None

    def select(self, index: torch.Tensor) -> EnsembleState:
        return EnsembleState([state.select(index) for state in self.members])


def mean_log_probs(logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """log of the mean of the members' softmax: M x [N, V] logits -> [N, V] log-probabilities."""
    stacked = torch.stack([torch.log_softmax(x.float(), dim=1) for x in logits])  # [M, N, V]
    return torch.logsumexp(stacked, dim=0) - torch.log(torch.tensor(float(len(logits)), device=stacked.device))
