"""The paper's objective (train.objective: xe): Eq. 14 on (image, caption) pairs, each caption's word
costs plus lambda times its attention's coverage term, with hard attention's REINFORCE terms
(Sec. 4.1) where the decoder samples locations: `paper_loss`, the terms of captioning.model.paper
on a batch, and `PaperObjective`, what it needs from a run: the epoch's batches, hard attention's
uniforms and baseline, the words' weights. The run steps it (captioning.train.step).

Notation: B pairs of this process's part of a global batch, K samples of locations per caption.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from captioning.config import Config
from captioning.config.registry import OBJECTIVES
from captioning.data.dataset import Batch, epoch_batches
from captioning.data.flips import mirror_batches
from captioning.data.run_data import RunData
from captioning.data.vocab import Vocabulary
from captioning.model.attention import hard_attention, shared_coins
from captioning.model.paper import DecoderOutput, Draws, Reinforce, cross_entropy, doubly_stochastic
from captioning.runtime import distributed
from captioning.runtime.distributed import Agreement
from captioning.runtime.hardware import Hardware
from captioning.runtime.precision import FULL_PRECISION, Precision
from captioning.train.build import RunModel
from captioning.train.extras.word_weights import word_weight_vector
from captioning.train.objective import Loss, StepResult, weighted_terms
from captioning.train.step import take_step


@OBJECTIVES.register("xe")
class PaperObjective:
    """Eq. 14 (and Sec. 4.1's terms for hard attention) on the run's training pairs."""

    paper_loss = True  # its loss is paper_loss's: what train.graph's step holds (train/graphed.py)

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
        if self.config.data.mirror:  # data/flips.py (not in the paper)
            batches = mirror_batches(batches, pairs=len(lengths), seed=t.seed, epoch=epoch)
        return batches

    def loss(self, batch: Batch, *, step: int, size: int, counted: bool = True) -> Loss:
        """Eq. 14 of this process's part of a global batch of `size` pairs (paper_objective.paper_loss), with
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
        now being stepped (paper_objective.row_uniforms); None for soft attention, which samples nothing.
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


# The paper's loss on a batch --------------------------------------------------------------------

# Terms a new objective adds to the paper's loss: (decoder output, targets [B, T], mask [B, T]) ->
# {name: weighted term} (PaperObjective.terms).
Terms = Callable[[DecoderOutput, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


def expectation_prob_at(step: int, *, expectation_prob: float, warmup: int) -> float:
    """Hard attention's probability of using the expectation for a caption at the run's optimizer
    step `step`: the paper's `expectation_prob` (model.hard.expectation_prob, 0.5; Sec. 4.1) after a
    warm-up of `warmup` steps (model.hard.warmup, not in the paper) in which it falls linearly from
    1, so that attention first learns where objects are the soft way. The schedule belongs to the
    run, not the model: the step reads it and hands the coins in (Draws)."""
    if warmup == 0:
        return expectation_prob
    done = min(1.0, step / warmup)
    return 1.0 - (1.0 - expectation_prob) * done


def row_uniforms(*, seed: int, step: int, size: int, start: int, rows: int, samples: int, width: int,
              coin: str = "image", positions: torch.Tensor | None = None) -> torch.Tensor:
    """Hard attention's uniforms for this process's `rows` captions, from row `start` of a
    global batch of `size`, each caption's `samples` rows in a row: [rows * samples, 1 + width] (a
    coin, then one per step: Draws.from_uniform). Every process of a run draws the whole global
    batch's from the same seed (train.seed, the step), shares its coins out (one per image, or one
    for the global batch with `coin="batch"`: model.hard.coin) and keeps its own rows, so the samples
    are those of one process, however many share the batch. `positions` [rows]: where each caption
    sits in this process's part, when some of the part's pairs were left out (unreadable images):
    each keeps its own draws."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    uniforms = torch.rand(max(size, start + rows) * samples, 1 + width, generator=generator)  # [batch rows, 1 + W]
    uniforms = shared_coins(uniforms, group=samples, coin=coin)
    captions = start + (torch.arange(rows) if positions is None else positions.long())  # [rows], in the global batch
    return uniforms[(captions[:, None] * samples + torch.arange(samples)).flatten()]  # [rows * samples, 1 + W]


def paper_loss(model: nn.Module, batch: Batch, *, ds_lambda: float, precision: Precision = FULL_PRECISION,
               reinforce: Reinforce | None = None, word_weights: torch.Tensor | None = None, step: int = 0,
               uniforms: torch.Tensor | None = None, hard_warmup: int = 0, counted: bool = True,
               terms: Terms | None = None) -> Loss:
    """Eq. 14 (cross-entropy plus lambda times the doubly stochastic term) of a batch, plus, when the
    decoder's attention samples locations (hard attention), the REINFORCE terms of `reinforce`
    (Sec. 4.1). Every term is summed over the captions and divided by the batch's real target words
    (paper.doubly_stochastic says why), so `ds_lambda` is the paper's lambda.

    `model(batch.source, inputs)` is a decoder (on annotations) or an EncoderDecoder (needed with
    `reinforce.location_samples` > 1: it copies each image after the encoder, so the CNN runs once
    per image). `word_weights` [V] weight each target word's cross-entropy (paper.cross_entropy;
    None: all 1). `step` is the run's optimizer steps so far: every warm-up (hard attention's coin
    over `hard_warmup` steps: expectation_prob_at; the REINFORCE terms) reads it. `uniforms` [B*K, 1 + T]
    (hard attention): each row's uniform draws (Draws.from_uniform; a run's come from row_uniforms)
    instead of torch's RNG, so that the samples do not depend on how a run splits its batch. Without
    them hard attention draws from torch's RNG: each row its own coin, or, with
    `reinforce.location_samples` > 1, uniforms drawn here whose coins each image's rows share.
    `counted` False: the batch stands in for this process's empty part of a global batch
    (stand_in_batch), so its rewards do not move the baseline. `terms(output, targets, mask)`: terms
    added to the paper's, each already weighted, by name (PaperObjective.terms).

    The REINFORCE baseline moves by the batch's rewards only once the step is applied (the Loss's
    `applied`): a skipped step's rewards may not be finite.
    """
    model.train()
    samples = reinforce.location_samples if reinforce is not None else 1
    tokens = batch.tokens.repeat_interleave(samples, dim=0)  # [B*K, T]: K samples of locations per caption
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # [B, T-1]: predict word t+1 from word t
    mask = (targets != Vocabulary.pad_id).float()  # [B, T-1], padding reaches no term
    repeats = {"repeats": samples} if samples > 1 else {}
    hard = hard_attention(model)
    if hard is not None:  # the coins, flipped at this step's probability of the expectation (Sec. 4.1)
        now = expectation_prob_at(step, expectation_prob=hard.expectation_prob, warmup=hard_warmup)
        if uniforms is None and samples > 1:  # an image's K rows share its coin
            drawn = torch.rand(tokens.shape[0], inputs.shape[1] + 1, device=tokens.device)  # [B*K, 1 + T-1]
            uniforms = shared_coins(drawn, group=samples, coin=hard.coin)
        repeats["draws"] = (Draws(expectation_prob=now) if uniforms is None else  # coins from torch's RNG
                            Draws.from_uniform(uniforms[:, : inputs.shape[1] + 1],  # [B*K, 1 + T-1]
                                               expectation_prob=now))
    with precision.autocast():
        output = model(batch.source, inputs, lengths=mask.sum(1).long(), **repeats)  # padded steps not computed
    logits = output.logits.float()  # [B, T-1, V]
    xe = cross_entropy(logits, targets, mask, word_weights=word_weights)
    ds = doubly_stochastic(output.alphas.float(), mask)
    loss, stats, applied = xe + ds_lambda * ds, {"xe": xe, "ds": ds}, None
    for name, term in (terms(output, targets, mask) if terms is not None else {}).items():
        loss, stats[name] = loss + term, term
    if reinforce is not None and output.log_probs is not None:  # soft attention samples nothing
        estimate = reinforce(logits=logits, targets=targets, mask=mask, log_probs=output.log_probs.float(),
                             entropies=output.entropies.float(), locations=output.locations, step=step,
                             counted=counted)
        loss, stats = loss + estimate.loss, {**stats, **estimate.stats}
        applied = partial(reinforce.move, estimate)
    return Loss(loss, stats, applied)


def train_step(model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, *, grad_clip: float,
               agree: Callable[[torch.Tensor], Agreement] | None = None, scaler: torch.amp.GradScaler | None = None,
               stand_in: bool = False, **loss: Any) -> StepResult:
    """One optimizer step of the paper's loss (paper_loss, which takes the keywords in `loss`), as a
    run takes it (take_step): what tests and benchmarks call to step a model directly."""
    return take_step(paper_loss(model, batch, counted=not stand_in, **loss), list(model.parameters()), optimizer,
                     grad_clip=grad_clip, scaler=scaler, agree=agree)
