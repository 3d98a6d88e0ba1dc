"""Training losses: word cross-entropy, the doubly stochastic attention term (Eq. 14) and the
REINFORCE terms of hard attention (Sec. 4.1, Eqs. 10-12).

Notation: B batch, T caption steps, L grid cells, V vocabulary size. `mask` [B, T] is 1 on real
target words (including <end>) and 0 on padding; padding reaches no term.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from captioning.config.schema import ReinforceConfig
from captioning.runtime.to_host import floats


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, *,
                  word_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean negative log-likelihood per real target word. logits [B, T, V], targets/mask [B, T].

    `word_weights` [V] (not in the paper; train.word_weights) multiplies each target word's term by
    its word's weight. The sum is still divided by the number of real words, not by the total
    weight, so that all-ones weights give the plain loss and the REINFORCE terms and the share of a
    distributed batch (both per real word) keep their proportions.
    """
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)  # [B, T]
    weighted = mask if word_weights is None else mask * word_weights[targets]  # [B, T]
    return (nll * weighted).sum() / mask.sum()


def doubly_stochastic(alphas: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_i (tau - sum_t alpha_ti)^2 of each caption (Eq. 14), summed over the captions and divided
    by the number of real target words, as `cross_entropy` is. alphas [B, T, L], mask [B, T].

    Eq. 14 adds lambda sum_i (1 - sum_t alpha_ti)^2 to each caption's -log p(y|a), a sum over its
    words. The training objective divides both by the batch's real words (the learning rate and
    clipping then do not depend on caption length), so `train.ds_lambda` is the paper's lambda: the
    weight of the term against a caption's summed word costs.

    The paper's tau = 1 asks every cell to receive a total weight of 1 over the caption. A caption of
    T words carries a total weight of exactly T, so with T < L the paper's target cannot be met, and
    tau = T/L, the target that can be met, may look like the fix. But sum_i (tau - S_i)^2 =
    L tau^2 - 2 tau sum_i S_i + sum_i S_i^2 and sum_i S_i = T whatever the maps, so any tau that
    depends on T alone moves the term by a constant: the gradient is the same, pushing towards
    uniform coverage (sum_i S_i^2) (tests/train/test_losses.py). Only the paper's tau = 1 is kept.
    """
    mask = mask.to(alphas.dtype)
    totals = (alphas * mask[:, :, None]).sum(dim=1)  # [B, L], sum_t alpha_ti over real steps
    return ((1 - totals) ** 2).sum() / mask.sum()


def caption_log_likelihood(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(y|s,a) of each caption [B]: its word log-probabilities summed over its real words only.

    logits [B, T, V], targets/mask [B, T]. Row n of the result is caption n's, whatever the padding.
    """
    words = torch.log_softmax(logits.float(), dim=2).gather(2, targets[:, :, None]).squeeze(2)  # [B, T]
    return (words * mask).sum(dim=1)


def leave_one_out(rewards: torch.Tensor, counted: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's baseline: the mean reward of the *other* counted samples of its group (hard
    attention's replicas of a caption; self-critical training's samples of an image). rewards [G, K],
    counted [G, K] bool (None: all). Returns the baselines [G, K] (0 where no other sample counts) and
    how many other samples each has [G, K]. An uncounted reward enters no sum, whatever it is."""
    counted = torch.ones_like(rewards, dtype=torch.bool) if counted is None else counted
    r = torch.where(counted, rewards, torch.zeros_like(rewards))  # [G, K]
    c = counted.to(rewards.dtype)  # [G, K]
    others = c.sum(dim=1, keepdim=True) - c  # [G, K], counted samples besides this one
    return (r.sum(dim=1, keepdim=True) - r) / others.clamp(min=1), others


def _alone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@dataclass(frozen=True)
class ReinforceTerms:
    """One batch's REINFORCE surrogate and statistics, and what its rewards would move the moving
    average by; `Reinforce.move` moves it once the step is known to be applied."""

    loss: torch.Tensor  # the surrogate, a scalar on the device
    stats: dict[str, float]  # what a run logs
    sampled: float  # captions of the global batch that sampled locations
    reward: float  # their mean reward (0 when none did)


class Reinforce:
    """The hard attention terms of the gradient of the variational bound L_s (Sec. 4.1, Eq. 12).

    For a caption y with sampled locations s~ the paper's per-caption gradient is
        d log p(y|s~,a) + lambda_r (log p(y|s~,a) - b) d log p(s~|a) + lambda_e d H[s~].
    The first term is the word cross-entropy that the training step already minimizes; `__call__`
    returns a surrogate loss whose gradient is minus the other two, summed over the captions of the
    batch and divided, like `cross_entropy`, by the number of real words, so the three keep the
    paper's proportions:
        -[lambda_r sum_n (r_n - b_n) sum_t m_nt log p(s_nt) + lambda_e sum_n sum_t m_nt H_nt] / sum m.
    The reward r_n = log p(y_n|s~_n, a) (`caption_log_likelihood`, detached) is computed per row, so
    it stays with that row's own samples whatever the padding. Captions whose image used the soft
    expectation (location -1) sampled nothing and get neither term, and do not move the baseline;
    their advantage is exactly 0, whatever their reward.

    Baselines b_n: "moving_average" (the paper: b <- decay b + (1 - decay) mean_n r_n over sampled
    captions, starting from the first batch's mean; moved by `move` after a step that was applied,
    so that a skipped step, whose rewards may not be finite, leaves it as it was); "leave_one_out"
    (with `location_samples` >= 2 replicas of each caption in consecutive rows, b_n = the mean reward of its
    *other* sampled replicas, falling back to the moving average when it has none); "none" (b = 0,
    for comparison).

    `weight_warmup` > 0 (not in the paper): both terms are scaled by min(1, (step + 1) / weight_warmup), `step`
    being the run's optimizer steps before this one, so they come in gradually. Early in training
    the decoder reads a sampled object cell worse than the expectation it mostly trained on, so the
    bound's gradient (unbiased: tests) can say "look away from objects". Sampled rows still train
    the decoder through the cross-entropy meanwhile.
    """

    def __init__(self, *, weight: float = 1.0, entropy_weight: float = 0.0, baseline: str = "moving_average",
                 baseline_decay: float = 0.9, location_samples: int = 1, weight_warmup: int = 0,
                 across: Callable[[torch.Tensor], torch.Tensor] = _alone):
        """`across` sums a tensor over the processes of a run (captioning.runtime.distributed.summed;
        itself for one process): the baseline then moves by the *global* batch's mean reward, so that
        every process keeps the same b, the one-process b."""
        self.weight, self.entropy_weight = weight, entropy_weight
        self.baseline, self.decay = baseline, baseline_decay
        self.location_samples, self.weight_warmup = location_samples, weight_warmup
        self.value: float | None = None  # the moving average b; None until the first sampled batch
        self.across = across

    @classmethod
    def from_config(cls, reinforce: ReinforceConfig, *,
                    across: Callable[[torch.Tensor], torch.Tensor] = _alone) -> Reinforce:
        return cls(weight=reinforce.weight, entropy_weight=reinforce.entropy_weight, baseline=reinforce.baseline,
                   baseline_decay=reinforce.baseline_decay, location_samples=reinforce.location_samples,
                   weight_warmup=reinforce.weight_warmup, across=across)

    def pooled(self, rewards: torch.Tensor, sampled: torch.Tensor, *, counted: bool = True) -> torch.Tensor:
        """[2]: the sum of the rewards of the captions that sampled and their number, over every
        process's part of the batch (`across`); on the device. `counted` False: this process's part
        is a stand-in (an empty part of a global batch), whose rewards must not count."""
        local = torch.stack([torch.where(sampled, rewards, torch.zeros_like(rewards)).sum(),
                             sampled.sum().to(rewards.dtype)])
        return self.across(local * float(counted))

    def baselines(self, rewards: torch.Tensor, sampled: torch.Tensor,
                  pooled: torch.Tensor | None = None) -> torch.Tensor:
        """b_n [B] for rewards [B] of captions that sampled (sampled [B] bool); the state is not changed.
        `pooled`: `self.pooled(rewards, sampled)` where the caller has it already."""
        if self.baseline == "none":
            return torch.zeros_like(rewards)
        if self.value is None:  # first batch: its own mean, not 0 (rewards are sums of log-probs, ~ -10)
            pooled = self.pooled(rewards, sampled) if pooled is None else pooled
            moving = (pooled[0] / pooled[1].clamp(min=1)).expand_as(rewards)  # [B], kept on the device
        else:
            moving = torch.full_like(rewards, self.value)  # [B]
        if self.baseline == "moving_average":
            return moving
        k = self.location_samples
        loo, others = leave_one_out(rewards.view(-1, k), sampled.view(-1, k))  # [images, K]
        return torch.where(others > 0, loo, moving.reshape(loo.shape)).view(-1)

    def move(self, terms: ReinforceTerms) -> None:
        """The moving average moved by the rewards of a batch whose step was applied (Sec. 4.1):
        b <- decay b + (1 - decay) mean reward of the captions that sampled. A batch where none
        sampled, or whose mean is not finite, leaves it as it was."""
        count, mean = terms.sampled, terms.reward
        if count == 0 or not math.isfinite(mean):
            return
        self.value = mean if self.value is None else self.decay * self.value + (1 - self.decay) * mean

    def scale(self, step: int) -> float:
        """How much of both terms counts at the run's `step` (steps done before this one)."""
        return min(1.0, (step + 1) / self.weight_warmup) if self.weight_warmup else 1.0

    def __call__(self, *, logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, log_probs: torch.Tensor,
                 entropies: torch.Tensor, locations: torch.Tensor, step: int = 0,
                 counted: bool = True) -> ReinforceTerms:
        """The surrogate loss and statistics; the baseline is not moved (`move`, after the step).
        log_probs/entropies/locations [B, T] come from the decoder (DecoderOutput), logits [B, T, V],
        targets/mask [B, T]. `counted`: as in `pooled`."""
        mask = mask.to(log_probs.dtype)
        rewards = caption_log_likelihood(logits.detach(), targets, mask)  # [B], r_n
        sampled = (locations >= 0).any(dim=1)  # [B]; the coin is per image, so per caption
        pooled = self.pooled(rewards, sampled, counted=counted)  # [2], over every process's part of the batch
        baselines = self.baselines(rewards, sampled, pooled)  # [B]
        # 0 where nothing was sampled, chosen rather than multiplied: 0 * NaN would be NaN.
        advantage = torch.where(sampled, rewards - baselines, torch.zeros_like(rewards))  # [B]
        steps = mask * sampled[:, None]  # [B, T], real steps of captions that sampled
        score_function = (advantage[:, None] * log_probs * steps).sum()  # sum_n (r_n - b_n) log p(s~_n|a)
        entropy = (entropies * steps).sum()  # sum_n H[s~_n]
        scale = self.scale(step)
        loss = -scale * (self.weight * score_function + self.entropy_weight * entropy) / mask.sum()
        # What the baseline's move and the statistics need, in one trip to the host (on a GPU each
        # trip waits for all the work queued before it).
        loss_value, count, reward, share, entropy_value, compared = floats(
            loss, pooled[1], pooled[0] / pooled[1].clamp(min=1), sampled.float().mean(),
            entropy / steps.sum().clamp(min=1),
            torch.where(sampled, baselines, torch.zeros_like(baselines)).sum() / sampled.sum().clamp(min=1))
        stats = {"reinforce": loss_value, "reward": reward,  # of the global batch; 0 when no caption sampled
                 # the mean b_n the sampled captions were compared with (the moving average as it stands)
                 "baseline": compared if share else (self.value or 0.0),
                 "sampled": share, "reinforce_scale": scale, "entropy": entropy_value}
        return ReinforceTerms(loss=loss, stats=stats, sampled=count, reward=reward)

    def state_dict(self) -> dict[str, Any]:
        """Plain data for checkpoints (the moving average must survive a resume; the warm-up reads the
        run's step, which checkpoints keep with the run's progress)."""
        return {"baseline": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A baseline that is not finite (a checkpoint written before skipped steps left it alone)
        starts again from the next batch's mean, as at the start of a run."""
        value = state.get("baseline")
        self.value = float(value) if value is not None and math.isfinite(float(value)) else None
