"""Several trained decoders decoded together, in one greedy or beam search (not in the paper).

An ensemble's next-word distribution is the mean of its members' probabilities:

    p(y_t | y_<t, a) = 1/M sum_m p_m(y_t | y_<t, a)

each member running its own recurrence (h, c, attention) over its annotations a, fed the words
the search chose. The search sees one decoder whose step returns log p, so greedy, beam search, the
length penalty and the n-gram block work unchanged (captioning.model.decoding.stepper joins the
members' steps). A word's map is the mean of the members' maps. The members index the same
vocabulary and attend over one grid; the caller checks both (captioning.checkpoint.load_ensemble).

Members whose encoders differ (one fine-tuned, encoder.fine_tune_from, beside a frozen one) read
annotations of their own. The search still sees one tensor: each encoder's annotations side by
side along the channels, a *view* each ([B, L, D_1 + D_2 + ...]), and `views` says which view each
member reads; members that share an encoder share its view (JoinedEncoder, below, computes the
views; captioning.checkpoint.shared_views says which members share one).

Notation: M members, N rows (images x beams), V words, L cells, D_v the channels of view v.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from captioning.model.encoder import Encoder, as_annotations
from captioning.model.state import DecoderState


class Ensemble(nn.Module):
    """Decoders whose word probabilities are averaged at every step (decoding only)."""

    def __init__(self, members: Sequence[nn.Module], *, views: Sequence[int] | None = None):
        """`views`: the view of the annotations each member reads (0, 1, ...: in the order the views
        lie along the channels); None: all read the one view, the whole tensor."""
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least two decoders, got {len(members)}")
        views = [0] * len(members) if views is None else list(views)
        if len(views) != len(members) or sorted(set(views)) != list(range(max(views) + 1)):
            raise ValueError(f"views {views}: one per member, numbered 0, 1, ... with none left out")
        widths = {}
        for member, view in zip(members, views):
            if widths.setdefault(view, member.annotation_dim) != member.annotation_dim:
                raise ValueError(f"view {view} is read by members of {widths[view]} and {member.annotation_dim} "
                                 "channels")
        self.members = nn.ModuleList(members)
        self.views = views
        starts = [sum(widths[v] for v in range(view)) for view in range(len(widths))]
        self.slices = [slice(starts[view], starts[view] + widths[view]) for view in views]  # each member's channels
        self.dim = sum(widths.values())  # D_1 + D_2 + ...: the channels the search's annotations have

    def annotations(self, annotations: torch.Tensor) -> list[torch.Tensor]:
        """Each member's own view: [B, L, D_1 + D_2 + ...] -> M x [B, L, D_v]."""
        if annotations.shape[-1] != self.dim:
            raise ValueError(f"the ensemble's members read {self.dim} channels of annotations, got "
                             f"{annotations.shape[-1]}")
        return [annotations[..., part] for part in self.slices]

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


class JoinedEncoder(nn.Module):
    """Encoders whose annotations lie side by side along the channels, one view each: pixels
    [B, 3, S, S] -> [B, L, D_1 + D_2 + ...], what an Ensemble with `views` reads. They share the
    pixels and the maps: one normalization (checked here) and one grid (checked as they run).

    Stages they hold alike run once: a fine-tuned encoder's frozen stages are the pretrained ones
    (encoder.fine_tune_from), so beside the frozen encoder it adds only the stages it fine-tuned."""

    def __init__(self, encoders: Sequence[Encoder]):
        super().__init__()
        normalizations = {(tuple(e.mean), tuple(e.std)) for e in encoders}
        if len(normalizations) > 1:
            raise ValueError("encoders that normalize their images differently cannot share them: "
                             f"{sorted(normalizations)}")
        self.encoders = nn.ModuleList(encoders)
        self.mean, self.std = encoders[0].mean, encoders[0].std
        self.dim = sum(e.dim for e in encoders)
        self.shared = shared_stages(encoders)  # the leading stages of the first that run for all

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        trunk = self.encoders[0].body[:self.shared](pixels)  # [B, C, H, W] (the pixels where none is shared)
        parts = [as_annotations(encoder.body[self.shared:](trunk)) for encoder in self.encoders]  # V x [B, L, D_v]
        grids = [grid for _, grid in parts]
        if len(set(grids)) > 1:
            raise ValueError(f"the encoders' grids differ ({', '.join(f'{h}x{w}' for h, w in grids)}); an ensemble's "
                             "maps are over one grid")
        return torch.cat([annotations for annotations, _ in parts], dim=2), grids[0]


def shared_stages(encoders: Sequence[Encoder]) -> int:
    """How many leading stages every encoder holds alike: the same stage names, modules (their
    settings, a border's padding among them) and weights and buffers."""
    bodies = [dict(encoder.body.named_children()) for encoder in encoders]
    names = list(bodies[0])
    shared = 0
    for name in names:
        if any(list(body)[:shared + 1] != names[:shared + 1] for body in bodies):
            break
        first = bodies[0][name]
        if not all(repr(body[name]) == repr(first) and _same(first.state_dict(), body[name].state_dict())
                   for body in bodies[1:]):
            break
        shared += 1
    return shared


def _same(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> bool:
    return one.keys() == other.keys() and all(torch.equal(one[key], other[key]) for key in one)
