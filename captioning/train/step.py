"""One optimizer step of any objective's loss: the gradients applied (skipped where not finite), and,
under torchrun, this process's part of a global batch (`Stepping`: stand-ins for an empty part, what
the processes agree on, unreadable images).

Notation: B batch, T caption steps, L grid cells, D channels, S input side, V vocabulary.

The run around it is loop.py (checkpoints, signals, validation, the epoch loop); the losses are the
objectives' (paper_objective.py, scst.py).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from captioning.config import Config
from captioning.data.dataset import Batch
from captioning.data.records import too_many_unreadable
from captioning.data.vocab import Vocabulary
from captioning.runtime import distributed
from captioning.runtime.distributed import Agreement
from captioning.runtime.hardware import Hardware, floats
from captioning.train.build import RunModel
from captioning.train.graphed import GraphedStep
from captioning.train.objective import Loss, Objective, StepResult, TrainingError


@dataclass(frozen=True)
class Applied:
    """What apply_gradients did: the loss and the gradient norm, on the host; the values asked for
    beside them (`also`); whether the step was skipped."""

    loss: float
    norm: float
    values: tuple[float, ...]
    skipped: bool


def apply_gradients(loss: torch.Tensor, objective: torch.Tensor, parameters: list[torch.Tensor],
                    optimizer: torch.optim.Optimizer, *, grad_clip: float,
                    scaler: torch.amp.GradScaler | None = None, agreement: Agreement | None = None,
                    also: tuple[torch.Tensor, ...] = ()) -> Applied:
    """Backward `objective`, clip and step, unless the step is skipped.

    A non-finite `loss` or gradient norm skips the update (the weights and the optimizer's moments
    stay as they were) instead of writing NaN into them: mixed precision has isolated spikes that a
    run should survive; the caller counts them and stops after too many in a row. The backward always
    runs, so that under DistributedDataParallel every process takes part in the same all-reduce and
    all of them see the same non-finite norm and skip together; `agreement` is what the processes
    agreed on before (train_step's `agree`): a loss not finite in another process, or no image in
    any, skips here too. `also`: 0-dim tensors brought to the host in the same trip as the loss and
    the norm (one trip for everything the step reports).
    """
    norm = backward_and_clip(objective, parameters, optimizer, grad_clip=grad_clip, scaler=scaler)
    loss_value, norm_value, *values = floats(loss, norm, *also)
    agreed = agreement is None or (agreement.finite and not agreement.empty)
    skipped = not (agreed and math.isfinite(norm_value) and math.isfinite(loss_value))
    step_unless_skipped(optimizer, skipped=skipped, scaler=scaler)
    return Applied(loss=loss_value, norm=norm_value, values=tuple(values), skipped=skipped)


def backward_and_clip(objective: torch.Tensor, parameters: list[torch.Tensor], optimizer: torch.optim.Optimizer, *,
                      grad_clip: float, scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
    """The first half of apply_gradients: fresh gradients of `objective`, clipped; their norm (on the device)."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        objective.backward()
    else:
        scaler.scale(objective).backward()
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    return torch.nn.utils.clip_grad_norm_(parameters, grad_clip)


def step_unless_skipped(optimizer: torch.optim.Optimizer, *, skipped: bool,
                        scaler: torch.amp.GradScaler | None = None) -> None:
    """The second half of apply_gradients: the optimizer step, or the gradients dropped when `skipped`
    (for any reason: this process's gradients, its loss, or what the processes agreed on).

    A GradScaler's iteration always ends in `update()`, skipped or not: `unscale_` has already run,
    and only `update()` clears its record of that (the next step's `unscale_` raises otherwise). The
    scale then moves by the scaler's own rule on what `unscale_` found: backed off where the
    gradients held inf or NaN, one more finite step towards growth where they did not."""
    if not skipped:
        if scaler is not None:
            scaler.step(optimizer)  # the unscaled gradients are finite here: it steps
        else:
            optimizer.step()
    if scaler is not None:
        scaler.update()
    if skipped:
        optimizer.zero_grad(set_to_none=True)


def stand_in_batch(*, annotations: tuple[int, int] | None = None, images: tuple[int, int, int] | None = None) -> Batch:
    """One image of zeros, annotations [1, L, D] or pixels [1, 3, S, S], captioned "<start> <end>":
    what a process steps on when its part of a global batch is empty, so that it meets the other
    processes' collectives (its terms get a share of 0: captioning.runtime.distributed.agree)."""
    tokens = torch.tensor([[Vocabulary.start_id, Vocabulary.end_id]])  # [1, 2]
    return Batch(annotations=None if annotations is None else torch.zeros(1, *annotations), tokens=tokens,
                 lengths=torch.tensor([2]), images=None if images is None else torch.zeros(1, *images))


def take_step(loss: Loss, parameters: list[torch.Tensor], optimizer: torch.optim.Optimizer, *, grad_clip: float,
              scaler: torch.amp.GradScaler | None = None,
              agree: Callable[[torch.Tensor], Agreement] | None = None) -> StepResult:
    """One optimizer step on an objective's `loss`. `agree(loss)` is called between the forward and
    the backward, under torchrun: what the processes agreed on (captioning.runtime.distributed.agree);
    its share weights the loss by this process's share of the global batch's words, and no process
    updates unless every loss was finite. The numbers returned are this process's own; the loss's
    tensor statistics come to the host in the same trip as the loss and the gradient norm."""
    agreement = Agreement() if agree is None else agree(loss.value)
    # Every term is a sum over this process's captions divided by its real words: its share of the
    # global batch's words makes DDP's average the one-process objective.
    tensors = [name for name, value in loss.stats.items() if isinstance(value, torch.Tensor)]
    applied = apply_gradients(loss.value, agreement.share * loss.value, parameters, optimizer, grad_clip=grad_clip,
                              scaler=scaler, agreement=agreement, also=tuple(loss.stats[name] for name in tensors))
    if loss.applied is not None and not applied.skipped:
        loss.applied()
    stats = {**loss.stats, **dict(zip(tensors, applied.values))}
    return StepResult({"loss": applied.loss, **stats, "grad_norm": applied.norm}, skipped=applied.skipped,
                      agreement=agreement)


# this process's part of a global batch ------------------------------------------------------------
# How a run steps any objective: the plumbing around an objective's loss.
#
# The objective computes a loss (captioning.train.objective); the run owns everything else of a step:
# this process's part of a global batch, a stand-in batch where that part is empty (so that every
# process meets the same collectives), what the processes agree on, the images that could not be read
# (each named once; the run stopped past data.max_bad_images), and the gradients applied
# (captioning.train.step.take_step).

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
        self.graphed = self.graphed_step() if config.train.graph else None

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

        if self.graphed is not None:  # one process, its batch never empty (graphed_step)
            return self.graphed(batch)
        loss = self.objective.loss(batch, step=step, size=size, counted=own)
        result = take_step(loss, list(self.module.parameters()), self.optimizer, grad_clip=self.config.train.grad_clip,
                           scaler=self.scaler, agree=agree)
        if self.context.enabled and result.agreement.named:  # every process names every process's new ones
            self.name_unreadable([reason for part in distributed.everyone(self.context, new) for reason in part])
        return result if own else StepResult({}, skipped=result.skipped, agreement=result.agreement)

    def graphed_step(self) -> GraphedStep:
        """train.graph's step (train/graphed.py), where this run can take it: what the config's checks
        cannot see is refused here, before the first step."""
        problem = None
        if self.context.enabled:
            problem = "runs in one process, not under torchrun"
        elif self.scaler is not None:
            problem = ("cannot hold fp16's gradient scaler, which train.amp needs on this GPU (it has no bf16): "
                       "set train.amp=false")
        elif self.model.decoder.accelerator is None:
            problem = ("needs the fused path, which this decoder does not take: soft attention with the additive "
                       "score, queried with h_{t-1}, at temperature 1 (captioning/model/fused.py)")
        if problem is not None:
            raise TrainingError(f"train.graph {problem}")
        t = self.config.train  # the config's checks let train.graph through with the paper's objective alone
        return GraphedStep(self.model.decoder, self.optimizer, grad_clip=t.grad_clip, ds_lambda=t.ds_lambda,
                           precision=self.hardware.precision, word_weights=self.objective.word_weights)

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
