"""The objective seam: what a run trains towards, as a loss.

A run (captioning.train.loop.Run) keeps what every objective shares: the epochs, the progress, the
skipped steps, the weights' average, validation and checkpoints; and each optimizer step's plumbing
(captioning.train.step.Stepping: this process's part of a global batch, a stand-in where that
part is empty, what the processes agree on, unreadable images, the gradients applied). It asks its
objective for the rest:

    batches(epoch)        the epoch's global batches: lists of indices into `items`, a function of
                          (train.seed, epoch) alone (the run takes this process's part of each)
    items, collate        what an index reads and how a batch of them is put together
    loss(batch, ...)      the loss of this process's part of a global batch, and its statistics -> Loss
    state_dict()          what the objective keeps across a resume (and load_state_dict)

Two objectives, one module each: paper_objective.PaperObjective, the paper's (Eq. 14 on (image, caption)
pairs, with hard attention's REINFORCE terms, Sec. 4.1), and scst.SelfCriticalObjective (Rennie et
al., 2017, on images; train.objective: scst). A third would be a third module. A term added to the
loss is a registered function and its weight in train.terms; both objectives add it alike, on the
maps of the captions they train on (`weighted_terms`; docs/architecture.md writes one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset

from captioning.config.registry import TERMS
from captioning.runtime.distributed import Agreement


def weighted_terms(terms: dict[str, float], alphas: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """train.terms on the maps of a batch's captions: each registered term (captioning.config.registry.TERMS)
    times its weight, by name (the name the logs give it). alphas [B, T, L]; mask [B, T], 1 on real words."""
    if not terms:  # the usual case: no cast of the maps at every step
        return {}
    alphas = alphas.float()  # once for all the terms
    return {name: weight * TERMS[name](alphas, mask) for name, weight in terms.items()}


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. non-finite losses step after step); the last good checkpoint is kept."""


@dataclass(frozen=True)
class Loss:
    """One batch's loss, as an objective hands it to the step that applies it.

    `value`: the scalar to minimize, on the device, each term summed over the batch's items and
    divided as the objective documents (the run weights it by this process's share of the global
    batch). `stats`: what a run logs beside it, floats or 0-dim tensors (brought to the host with the
    loss, in one trip). `applied`: what to do once the step is known to be applied (a running
    statistic moved by the batch, e.g. REINFORCE's moving-average baseline), never after a skipped
    step, whose numbers may not be finite."""

    value: torch.Tensor
    stats: dict[str, torch.Tensor | float] = field(default_factory=dict)
    applied: Callable[[], None] | None = None


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did. `losses`: this process's numbers for the logs (the loss, its
    terms, the gradient norm, an estimator's statistics; empty where it had nothing of the batch);
    `skipped`: no weight moved, because a loss or gradient was not finite, here or in another process;
    `agreement`: what the processes agreed on in the step (captioning.runtime.distributed.agree)."""

    losses: dict[str, float]
    skipped: bool = False
    agreement: Agreement = field(default_factory=Agreement)


class Objective(Protocol):
    items: Dataset
    collate: Callable[[list], Any]

    def batches(self, epoch: int) -> list[list[int]]: ...

    def loss(self, batch: Any, *, step: int, size: int, counted: bool = True) -> Loss:
        """The loss of this process's part `batch` (on the device) of a global batch of `size` items,
        at the run's `step` (steps done before it). `counted` False: the batch is a stand-in for an
        empty part (Stepping), whose items must not count in anything pooled across processes."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
