"""How a run steps any objective: the plumbing around an objective's loss.

The objective computes a loss (captioning.train.objective); the run owns everything else of a step:
this process's part of a global batch, a stand-in batch where that part is empty (so that every
process meets the same collectives), what the processes agree on, the images that could not be read
(each named once; the run stopped past data.max_bad_images), and the gradients applied
(captioning.train.step.take_step).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from tqdm import tqdm

from captioning.config import Config
from captioning.data.records import too_many_unreadable
from captioning.runtime import distributed
from captioning.runtime.hardware import Hardware
from captioning.train.build import RunModel
from captioning.train.objective import Objective, StepResult
from captioning.train.step import TrainingError, stand_in_batch, take_step


class Stepping:
    """One optimizer step of `objective` at a time, on the run's trained `module` (an EncoderDecoder,
    wrapped in DDP under torchrun)."""

    def __init__(self, config: Config, *, objective: Objective, model: RunModel, module: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, hardware: Hardware,
                 training_images: int):
        self.config, self.objective, self.model, self.module = config, objective, model, module
        self.optimizer, self.hardware, self.context = optimizer, hardware, hardware.context
        self.scaler = scaler if scaler.is_enabled() else None
        self.training_images = training_images
        self.unreadable: set[str] = set()  # training images named as unreadable (encoder on the fly)

    def __call__(self, batch: Any, *, step: int, size: int, received: int | None) -> StepResult:
        """One optimizer step on this process's part `batch` of a global batch of `size` items, at the
        run's `step`; `received`: a stop signal this process got, for the processes to agree on.

        Under torchrun a process whose part is empty (none of its images could be read, or the global
        batch has fewer items than there are processes) still takes the step, on a stand-in batch
        whose terms weigh nothing, so that every process meets the same collectives. In one process an
        empty batch is no step at all."""
        failures = tuple(batch.failures)
        new = [reason for reason in dict.fromkeys(failures) if reason not in self.unreadable]
        own = len(batch) > 0
        if not self.context.enabled:
            self.name_unreadable(new)
            if not own:
                return StepResult({}, agreement=distributed.Agreement(empty=True, signal=received,
                                                                      unreadable=len(failures)))
        # counted before the batch moves: no wait for the device
        counts = batch.counts() if own and self.context.enabled else {"words": 0.0, "images": 0.0}
        batch = (batch if own else self.stand_in()).to(self.hardware.device, non_blocking=True)

        def agree(loss: torch.Tensor) -> distributed.Agreement:
            return distributed.agree(self.context, **counts, loss=loss if own else None, received=received,
                                     unreadable=len(failures), named=len(new))

        loss = self.objective.loss(batch, step=step, size=size, counted=own)
        result = take_step(loss, list(self.module.parameters()), self.optimizer, grad_clip=self.config.train.grad_clip,
                           scaler=self.scaler, agree=agree)
        if self.context.enabled and result.agreement.named:  # every process names every process's new ones
            self.name_unreadable([reason for part in distributed.everyone(self.context, new) for reason in part])
        return result if own else StepResult({}, skipped=result.skipped, agreement=result.agreement)

    def name_unreadable(self, reasons: list[str]) -> None:
        """Images the encoder on the fly could not read: each named once in the run, and the run
        stopped when they are more than data.max_bad_images of the training images. Under torchrun
        every process is given every process's, so all of them stop together."""
        new = [reason for reason in reasons if reason not in self.unreadable]
        for reason in new if self.context.is_main else ():
            tqdm.write(f"warning: skipping an unreadable image (from now on, quietly): {reason}", file=sys.stderr)
        self.unreadable.update(new)
        problem = too_many_unreadable("train", sorted(self.unreadable), self.training_images,
                                      limit=self.config.data.max_bad_images) if new else None
        if problem is not None:
            raise TrainingError(problem)

    def stand_in(self) -> Any:
        """What a process with an empty part of a global batch steps on (its terms get a share of 0)."""
        encoder = self.model.encoder
        if encoder is not None and encoder.cached_grid is not None:  # the frozen stages' output (encoder.cache_frozen)
            return stand_in_batch(annotations=(encoder.cached_grid[0] * encoder.cached_grid[1], encoder.cached_dim))
        if encoder is not None:
            return stand_in_batch(images=(3, self.config.data.image_size, self.config.data.image_size))
        return stand_in_batch(annotations=(self.model.grid[0] * self.model.grid[1], self.model.annotation_dim))
