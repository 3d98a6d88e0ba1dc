"""The paper's objective (train.objective: xe): Eq. 14 on (image, caption) pairs, each caption's word
costs plus lambda times its attention's coverage term, with hard attention's REINFORCE terms
(Sec. 4.1) where the decoder samples locations. The loss is captioning.train.step.paper_loss; this
module is what it needs from a run: the epoch's batches, hard attention's uniforms and baseline, the
words' weights. The run steps it (captioning.train.stepping).

Notation: B pairs of this process's part of a global batch, K samples of locations per caption.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from captioning.config import Config
from captioning.config.registry import OBJECTIVES
from captioning.data.dataset import Batch
from captioning.data.mirror import mirror_batches
from captioning.data.run_data import RunData
from captioning.data.sampling import epoch_batches
from captioning.model.paper import DecoderOutput, Reinforce
from captioning.runtime import distributed
from captioning.runtime.hardware import Hardware
from captioning.train.build import RunModel
from captioning.train.extras.word_weights import word_weight_vector
from captioning.train.objective import Loss, weighted_terms
from captioning.train.step import paper_loss, row_uniforms


@OBJECTIVES.register("xe")
class CrossEntropy:
    """Eq. 14 (and Sec. 4.1's terms for hard attention) on the run's training pairs."""

    def __init__(self, config: Config, *, data: RunData, model: RunModel, module: nn.Module, hardware: Hardware):
        """`module`: the trained graph (an EncoderDecoder, wrapped in DDP under torchrun)."""
        self.config, self.data, self.model, self.module = config, data, model, module
        self.hardware, self.context = hardware, hardware.context
        self.items, self.collate = data.pairs, data.collate
        t = config.train
        # Hard attention's REINFORCE terms and moving-average baseline (kept in checkpoints), one for
        # all processes: it moves by the global batch's mean reward. Soft attention samples nothing.
        self.reinforce = (Reinforce.from_config(t.reinforce, across=lambda tensor: distributed.summed(self.context,
                                                                                                     tensor))
                          if config.model.attention == "hard" else None)
        self.word_weights = (word_weight_vector(t.word_weights, data.vocab).to(hardware.device)
                             if t.word_weights else None)

    def batches(self, epoch: int) -> list[list[int]]:
        """Pairs of captions of similar length (data.bucket_batches), optionally mirrored (data.mirror)."""
        t, lengths = self.config.train, self.data.pairs.lengths
        batches = epoch_batches(lengths, batch_size=t.batch_size, seed=t.seed, epoch=epoch,
                                bucket=self.config.data.bucket_batches)
        if self.config.data.mirror:  # data/mirror.py (not in the paper)
            batches = mirror_batches(batches, pairs=len(lengths), seed=t.seed, epoch=epoch)
        return batches

    def loss(self, batch: Batch, *, step: int, size: int, counted: bool = True) -> Loss:
        """Eq. 14 of this process's part of a global batch of `size` pairs (step.paper_loss), with
        hard attention's REINFORCE terms and this objective's own `terms`."""
        t = self.config.train
        return paper_loss(self.module, batch, ds_lambda=t.ds_lambda, precision=self.hardware.precision,
                          reinforce=self.reinforce, word_weights=self.word_weights, step=step,
                          uniforms=self.uniforms(step=step, size=size, rows=len(batch), positions=batch.positions),
                          hard_warmup=self.config.model.hard.warmup, counted=counted, terms=self.terms)

    def terms(self, output: DecoderOutput, targets: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Terms added to the paper's, each weighted, by name (logged under it): train.terms on the
        teacher-forced maps (objective.weighted_terms). targets/mask [B, T]."""
        return weighted_terms(self.config.train.terms, output.alphas, mask)

    def uniforms(self, *, step: int, size: int, rows: int,
                 positions: torch.Tensor | None = None) -> torch.Tensor | None:
        """Hard attention's uniforms for this process's rows of the global batch of `size` pairs
        now being stepped (step.row_uniforms); None for soft attention, which samples nothing.
        `positions`: where each row sits in this process's part, when pairs with unreadable images
        were left out."""
        if self.reinforce is None:
            return None
        start, _ = self.context.shard(size)  # where this process's part of the batch begins
        return row_uniforms(seed=self.config.train.seed, step=step, size=size, start=start, rows=rows,
                         samples=self.reinforce.location_samples, width=self.config.data.max_caption_length + 2,
                         coin=self.config.model.hard.coin, positions=positions).to(self.hardware.device,
                                                                                   non_blocking=True)

    def state_dict(self) -> dict[str, Any]:
        return self.reinforce.state_dict() if self.reinforce is not None else {}  # hard attention's baseline

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.reinforce is not None:
            self.reinforce.load_state_dict(state)
