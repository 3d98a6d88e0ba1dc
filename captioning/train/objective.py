"""The objective seam: what a run trains towards, and what one optimizer step of it reports.

A run (captioning.train.loop.Run) keeps what every objective shares: the epochs, the progress, the
skipped steps, the weights' average, validation and checkpoints. It asks its objective for the rest:

    batches(epoch)        the epoch's global batches: lists of indices into `items`, a function of
                          (train.seed, epoch) alone (the run takes this process's part of each)
    items, collate        what an index reads and how a batch of them is put together
    step(batch, ...)      one optimizer step on this process's part of a global batch -> StepResult
    state_dict()          what the objective keeps across a resume (and load_state_dict)

Two objectives, one module each: cross_entropy.CrossEntropy, the paper's (Eq. 14 on (image, caption)
pairs, with hard attention's REINFORCE terms, Sec. 4.1), and scst.SelfCriticalObjective (Rennie et
al., 2017, on images; train.objective: scst). A third would be a third module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch.utils.data import Dataset

from captioning.runtime.distributed import Agreement


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

    def step(self, batch: Any, *, step: int, size: int, received: int | None) -> StepResult:
        """One optimizer step on this process's part of a global batch of `size` items, at the run's
        `step` (steps done before it); `received`: a stop signal this process got, for the processes
        to agree on."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
