"""The paper's objective (train.objective: xe): Eq. 14 on (image, caption) pairs, each caption's word
costs plus lambda times its attention's coverage term, with hard attention's REINFORCE terms
(Sec. 4.1) where the decoder samples locations. One optimizer step is captioning.train.step.train_step;
this module is what a run needs around it: the epoch's batches, this process's part of each, what
the processes agree on, and hard attention's draws.

Notation: B pairs of this process's part of a global batch, K samples of locations per caption.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from captioning.config import Config
from captioning.config.registry import OBJECTIVES
from captioning.data.dataset import Batch
from captioning.data.loading import RunData
from captioning.data.mirror import mirror_batches
from captioning.data.records import too_many_unreadable
from captioning.data.sampling import epoch_batches
from captioning.data.vocab import Vocabulary
from captioning.runtime import distributed
from captioning.runtime.hardware import Hardware
from captioning.train.build import RunModel
from captioning.train.extras.word_weights import word_weight_vector
from captioning.train.losses import Reinforce
from captioning.train.objective import StepResult
from captioning.train.step import TrainingError, row_draws, stand_in_batch, train_step


@OBJECTIVES.register("xe")
class CrossEntropy:
    """Eq. 14 (and Sec. 4.1's terms for hard attention) on the run's training pairs."""

    def __init__(self, config: Config, *, data: RunData, model: RunModel, module: nn.Module,
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, hardware: Hardware):
        """`module`: the trained graph (an EncoderDecoder, wrapped in DDP under torchrun)."""
        self.config, self.data, self.model, self.module = config, data, model, module
        self.optimizer, self.hardware, self.context = optimizer, hardware, hardware.context
        self.scaler = scaler if scaler.is_enabled() else None
        self.items, self.collate = data.pairs, data.collate
        t = config.train
        # Hard attention's REINFORCE terms and moving-average baseline (kept in checkpoints), one for
        # all processes: it moves by the global batch's mean reward. Soft attention samples nothing.
        self.reinforce = (Reinforce.from_config(t.reinforce, across=lambda tensor: distributed.summed(self.context,
                                                                                                     tensor))
                          if config.model.attention == "hard" else None)
        self.word_weights = (word_weight_vector(t.word_weights, data.vocab).to(hardware.device)
                             if t.word_weights else None)
        self.unreadable: set[str] = set()  # training images named as unreadable (encoder on the fly)

    def batches(self, epoch: int) -> list[list[int]]:
        """Pairs of captions of similar length (data.bucket_batches), optionally mirrored (data.mirror)."""
        t, lengths = self.config.train, self.data.pairs.lengths
        batches = epoch_batches(lengths, batch_size=t.batch_size, seed=t.seed, epoch=epoch,
                                bucket=self.config.data.bucket_batches)
        if self.config.data.mirror:  # data/mirror.py (not in the paper)
            batches = mirror_batches(batches, pairs=len(lengths), seed=t.seed, epoch=epoch)
        return batches

    def step(self, batch: Batch, *, step: int, size: int, received: int | None) -> StepResult:
        """One optimizer step on this process's part of a global batch of `size` pairs.

        Under torchrun a process whose part is empty (none of its images could be read, or the global
        batch has fewer pairs than there are processes) still takes the step, on a stand-in batch
        whose terms weigh nothing, so that every process meets the same collectives. In one process an
        empty batch is no step at all."""
        t = self.config.train
        new = [reason for reason in dict.fromkeys(batch.failures) if reason not in self.unreadable]
        own = batch.tokens.shape[0] > 0
        if not self.context.enabled:
            self.name_unreadable(new)
            if not own:
                return StepResult({}, agreement=distributed.Agreement(empty=True, signal=received,
                                                                      unreadable=len(batch.failures)))
        counts = {"words": 0.0, "images": 0.0}
        if own and self.context.enabled:  # counted before the batch moves: no wait for the device
            counts = {"words": float((batch.tokens[:, 1:] != Vocabulary.pad_id).sum()), "images": batch.tokens.shape[0]}
        failures = len(batch.failures)
        batch = (batch if own else self.stand_in()).to(self.hardware.device, non_blocking=True)

        def agree(loss: torch.Tensor) -> distributed.Agreement:
            return distributed.agree(self.context, **counts, loss=loss if own else None, received=received,
                                     unreadable=failures, named=len(new))

        result = train_step(self.module, batch, self.optimizer, grad_clip=t.grad_clip, ds_lambda=t.ds_lambda,
                            precision=self.hardware.precision, scaler=self.scaler,
                            agree=agree, reinforce=self.reinforce, word_weights=self.word_weights, step=step,
                            draws=self.draws(step=step, size=size, rows=batch.tokens.shape[0],
                                             positions=batch.positions),
                            hard_warmup=self.config.model.hard.warmup, stand_in=not own)
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
        problem = too_many_unreadable("train", sorted(self.unreadable), len(self.data.train.records),
                                      limit=self.config.data.max_bad_images) if new else None
        if problem is not None:
            raise TrainingError(problem)

    def stand_in(self) -> Batch:
        """What a process with an empty part of a global batch steps on (its terms get a share of 0)."""
        if self.model.encoder is not None:
            return stand_in_batch(images=(3, self.config.data.image_size, self.config.data.image_size))
        return stand_in_batch(annotations=(self.model.grid[0] * self.model.grid[1], self.model.annotation_dim))

    def draws(self, *, step: int, size: int, rows: int, positions: torch.Tensor | None = None) -> torch.Tensor | None:
        """Hard attention's uniform draws for this process's rows of the global batch of `size` pairs
        now being stepped (step.row_draws); None for soft attention, which samples nothing.
        `positions`: where each row sits in this process's part, when pairs with unreadable images
        were left out."""
        if self.reinforce is None:
            return None
        start, _ = self.context.shard(size)  # where this process's part of the batch begins
        return row_draws(seed=self.config.train.seed, step=step, size=size, start=start, rows=rows,
                         samples=self.reinforce.location_samples, width=self.config.data.max_caption_length + 2,
                         coin=self.config.model.hard.coin, positions=positions).to(self.hardware.device,
                                                                                   non_blocking=True)

    def state_dict(self) -> dict[str, Any]:
        return self.reinforce.state_dict() if self.reinforce is not None else {}  # hard attention's baseline

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.reinforce is not None:
            self.reinforce.load_state_dict(state)
