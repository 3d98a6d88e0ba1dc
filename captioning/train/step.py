"""One training step: the paper's loss (cross-entropy, the doubly stochastic term and, for hard
attention, the REINFORCE terms of Sec. 4.1), and the optimizer step that applies any objective's loss.

Notation: B batch, T caption steps, L grid cells, D channels, S input side, V vocabulary.

The run around it is loop.py (checkpoints, logs, signals, validation, the epoch loop) and stepping.py
(this process's part of a batch, stand-ins, agreement, unreadable images).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from captioning.data.dataset import Batch
from captioning.data.vocab import Vocabulary
from captioning.model.attention import hard_attention, shared_coins
from captioning.model.paper import DecoderOutput, Draws, Reinforce, cross_entropy, doubly_stochastic
from captioning.runtime.distributed import Agreement
from captioning.runtime.precision import FULL_PRECISION, Precision
from captioning.runtime.to_host import floats
from captioning.train.objective import Loss, StepResult

# Terms a new objective adds to the paper's loss: (decoder output, targets [B, T], mask [B, T]) ->
# {name: weighted term} (CrossEntropy.terms).
Terms = Callable[[DecoderOutput, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. non-finite losses step after step); the last good checkpoint is kept."""


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


def stand_in_batch(*, annotations: tuple[int, int] | None = None, images: tuple[int, int, int] | None = None) -> Batch:
    """One image of zeros, annotations [1, L, D] or pixels [1, 3, S, S], captioned "<start> <end>":
    what a process steps on when its part of a global batch is empty, so that it meets the other
    processes' collectives (its terms get a share of 0: captioning.runtime.distributed.agree)."""
    tokens = torch.tensor([[Vocabulary.start_id, Vocabulary.end_id]])  # [1, 2]
    return Batch(annotations=None if annotations is None else torch.zeros(1, *annotations), tokens=tokens,
                 lengths=torch.tensor([2]), images=None if images is None else torch.zeros(1, *images))


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
    added to the paper's, each already weighted, by name (CrossEntropy.terms).

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


def train_step(model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, *, grad_clip: float,
               agree: Callable[[torch.Tensor], Agreement] | None = None, scaler: torch.amp.GradScaler | None = None,
               stand_in: bool = False, **loss: Any) -> StepResult:
    """One optimizer step of the paper's loss (paper_loss, which takes the keywords in `loss`), as a
    run takes it (take_step): what tests and benchmarks call to step a model directly."""
    return take_step(paper_loss(model, batch, counted=not stand_in, **loss), list(model.parameters()), optimizer,
                     grad_clip=grad_clip, scaler=scaler, agree=agree)
