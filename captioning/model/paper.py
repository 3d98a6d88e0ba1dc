"""Show, Attend and Tell (Xu et al., ICML 2015), Sections 3 and 4, in one file: the model and its loss.

Notation: B batch (images, or beams), T caption steps, L grid cells, D annotation channels, E
embedding size, H hidden size, A attention size, V vocabulary. `mask` [B, T]: 1 on real target words.
The encoder (Sec. 3.1.1, captioning.model.encoder) gives the annotations a_1..a_L in R^D; the rest:

  e_ti    = f_att(a_i, h_{t-1}) = v^T tanh(W_a a_i + W_h h_{t-1})           Eq. 4   AdditiveScore
  alpha_t = softmax(e_t)                                                   Eq. 5   Attention.log_weights
  z_t     = phi(a, alpha_t): sum_i alpha_ti a_i (soft, Sec. 4.2, Eq. 13)   Eq. 6   SoftAttention
            or a_{s_t}, s_t ~ Multinoulli(alpha_t) (hard, Sec. 4.1)                HardAttention
  z_t     = beta_t z_t,  beta_t = sigmoid(f_beta(h_{t-1}))                 Sec. 4.2.1
  h_t, c_t = LSTM([E y_{t-1}; z_t], h_{t-1}, c_{t-1})                       Eqs. 1-3 AttentionDecoder._advance
  h_0 = tanh(f_init,h(mean_i a_i)),  c_0 = f_init,c(mean_i a_i)            Sec. 3.1.2 AttentionDecoder.start
  p(y_t) ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))                         Eq. 7   AttentionDecoder.word_logits
  loss    = -log p(y|a) + lambda sum_i (1 - sum_t alpha_ti)^2              Eq. 14  cross_entropy, doubly_stochastic
  hard:  + REINFORCE with a moving-average baseline and an entropy term    Eqs. 10-12 Reinforce

Around it, each importing it: the loop over t (model/packing.py), Eq. 14's sum with lambda on a batch
(train/paper_objective.paper_loss), the other scores and extras in its seams (model/scores.py, extras/),
and the fused path, which computes `_advance` faster and checks itself against it (model/fused.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from captioning.config.registry import SCORES
from captioning.config.schema import ReinforceConfig
from captioning.model.packing import teacher_forced
from captioning.model.scores import Score
from captioning.model.state import DecoderState
from captioning.runtime.hardware import floats

# Eq. 4: the attention score -----------------------------------------------------------------------

@SCORES.register("additive")
class AdditiveScore(Score):
    """The paper's f_att, Bahdanau's additive score: e_ti = v^T tanh(W_a a_i + W_h h_{t-1}). W_a a_i
    depends on the image alone: `keys` computes it once per image, not once per word."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        self.key = nn.Linear(annotation_dim, attention_dim)  # W_a (and the bias)
        self.query = nn.Linear(hidden_dim, attention_dim, bias=False)  # W_h
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def keys(self, annotations: torch.Tensor) -> torch.Tensor:
        return self.key(annotations)  # [B, L, A], once per image

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = self.query(hidden)  # [B, A]
        return self.v(torch.tanh(keys + query[:, None, :])).squeeze(2)  # [B, L], e_t


class PreviousState(nn.Module):
    """The query of Eq. 4: q_t = h_{t-1}. A seam: other queries are extras (query_word, word_attention)."""

    @staticmethod
    def dim(*, hidden_dim: int, embed_dim: int) -> int:
        return hidden_dim

    def forward(self, state: DecoderState, embedded: torch.Tensor) -> tuple[torch.Tensor, DecoderState]:
        return state.h, state  # [B, H]


# Eqs. 5-6: soft and hard attention (Sec. 4) -------------------------------------------------------

@dataclass
class Memory:
    """What attention needs of a batch of images, computed once per image."""

    annotations: torch.Tensor  # [B, L, D], as attention sees them
    keys: torch.Tensor | None  # the score's image-side work, e.g. W_a a [B, L, A]
    expectation: torch.Tensor | None = None  # [B] bool, hard while training: this caption uses the expectation
    draws: torch.Tensor | None = None  # [B, T], hard while training: each step's uniform draw (None: torch's RNG)
    t: int = 0  # steps taken with this memory: the column of `draws` read next

    def select(self, index: torch.Tensor) -> Memory:
        """Rows of the batch, e.g. each image once per beam."""
        rows = (None if t is None else t.index_select(0, index) for t in (self.annotations, self.keys,
                                                                            self.expectation, self.draws))
        return Memory(*rows, t=self.t)

    def prefix(self, rows: int) -> Memory:
        """The first `rows` images, as views: the rows still running when sorted by length."""
        return Memory(*(None if t is None else t[:rows] for t in (self.annotations, self.keys, self.expectation,
                                                                  self.draws)), t=self.t)


@dataclass
class AttentionOutput:
    context: torch.Tensor  # [B, D], z_t before the gate
    alpha: torch.Tensor  # [B, L], softmax(e_t), a distribution for both kinds
    log_prob: torch.Tensor | None = None  # [B], hard: log alpha_t[s_t] (0 where the expectation was used)
    entropy: torch.Tensor | None = None  # [B], hard: H[alpha_t]
    location: torch.Tensor | None = None  # [B] long, hard: s_t (-1 where the expectation was used)


@dataclass
class Draws:
    """Hard attention's randomness for a training forward, from the training step: the probability of
    the expectation now (0.5; any warm-up is the step's), each row's coin (expectation where coin <
    expectation_prob) and its draws for the cells (None: torch's RNG), whatever splits the batch."""

    expectation_prob: float
    coins: torch.Tensor | None = None  # [B], uniform in [0, 1)
    cells: torch.Tensor | None = None  # [B, T], uniform in [0, 1)

    @classmethod
    def from_uniform(cls, uniform: torch.Tensor, *, expectation_prob: float) -> Draws:
        """From uniform draws [B, 1 + T]: column 0 each row's coin, then one column per step."""
        return cls(expectation_prob=expectation_prob, coins=uniform[:, 0], cells=uniform[:, 1:])

    def select(self, index: torch.Tensor) -> Draws:
        return Draws(self.expectation_prob, *(None if t is None else t.index_select(0, index)
                                              for t in (self.coins, self.cells)))


class Attention(nn.Module):
    """What soft and hard attention share: the per-image work and alpha_t (Eqs. 4-5). Seams (not the
    paper): `inputs`, modules applied to the annotations before the score sees them (each may append
    `channels`, which widen z_t), and `temperature`, alpha_t = softmax(e_t / tau) (the paper: 1)."""

    def __init__(self, score: nn.Module, *, temperature: float = 1.0, inputs: tuple[nn.Module, ...] = ()):
        super().__init__()
        self.score, self.temperature = score, temperature
        self.inputs = nn.Sequential(*inputs)  # empty: the annotations as they are

    def context_dim(self, annotation_dim: int) -> int:
        return annotation_dim + sum(getattr(module, "channels", 0) for module in self.inputs)

    def start(self, annotations: torch.Tensor, draws: Draws | None = None) -> Memory:
        annotations = self.inputs(annotations)  # [B, L, D]
        return Memory(annotations=annotations, keys=self.score.keys(annotations))

    def log_weights(self, memory: Memory, query: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.score(memory.keys, query) / self.temperature, dim=1)  # [B, L], Eqs. 4-5


class SoftAttention(Attention):
    """Deterministic soft attention (Sec. 4.2): z_t = sum_i alpha_ti a_i (Eq. 13)."""

    def forward(self, memory: Memory, query: torch.Tensor) -> AttentionOutput:
        alpha = self.log_weights(memory, query).exp()  # [B, L]
        return AttentionOutput(context=torch.bmm(alpha[:, None, :], memory.annotations).squeeze(1), alpha=alpha)


class HardAttention(Attention):
    """Stochastic hard attention (Sec. 4.1): s_t ~ Multinoulli(alpha_t), z_t = a_{s_t}.

    Training: each caption flips one coin; with probability `expectation_prob` (the paper's 0.5) it
    uses the expectation sum_i alpha_ti a_i for its whole caption and samples nothing (log_prob 0,
    location -1). The authors' code flipped one coin per batch (`coin="batch"`). Test time: `choice`
    "expectation" (the paper's), "argmax" or "sample" (model/attention.py's `choosing`)."""

    def __init__(self, score: nn.Module, *, temperature: float = 1.0, inputs: tuple[nn.Module, ...] = (),
                 expectation_prob: float = 0.5, coin: str = "image", choice: str = "expectation"):
        super().__init__(score, temperature=temperature, inputs=inputs)
        self.expectation_prob, self.coin, self.choice = expectation_prob, coin, choice

    def start(self, annotations: torch.Tensor, draws: Draws | None = None) -> Memory:
        memory = super().start(annotations)
        if self.training:
            draws = draws if draws is not None else Draws(expectation_prob=self.expectation_prob)
            coins = draws.coins
            if coins is None:  # each row its own coin, or one for all (coin="batch")
                coins = torch.rand(annotations.shape[0], device=annotations.device)  # [B]
                coins = coins[:1].expand_as(coins) if self.coin == "batch" else coins
            memory.expectation, memory.draws = coins < draws.expectation_prob, draws.cells  # [B], [B, T]
        return memory

    def _choose(self, alpha: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        """s_t [B], and where the expectation is used instead [B] bool."""
        none = torch.zeros(alpha.shape[0], dtype=torch.bool, device=alpha.device)
        if self.training:
            expectation = memory.expectation if memory.expectation is not None else none
            if memory.draws is None:
                return sample(alpha.detach()), expectation
            draws = memory.draws[:, memory.t].to(alpha.dtype)  # [B]
            memory.t += 1
            return inverse_cdf(alpha.detach(), draws), expectation
        if self.choice == "sample":
            return sample(alpha.detach()), none
        return alpha.argmax(dim=1), none if self.choice == "argmax" else ~none

    def forward(self, memory: Memory, query: torch.Tensor) -> AttentionOutput:
        log_alpha = self.log_weights(memory, query)  # [B, L]
        alpha = log_alpha.exp()
        cell, expectation = self._choose(alpha, memory)  # [B], [B]
        index = cell[:, None, None].expand(-1, 1, memory.annotations.shape[2])  # [B, 1, D]
        chosen = memory.annotations.gather(1, index).squeeze(1)  # [B, D], a_{s_t}
        expected = torch.bmm(alpha[:, None, :], memory.annotations).squeeze(1)  # [B, D], Eq. 13
        return AttentionOutput(context=torch.where(expectation[:, None], expected, chosen), alpha=alpha,
                               log_prob=log_alpha.gather(1, cell[:, None]).squeeze(1).masked_fill(expectation, 0.0),
                               entropy=-(alpha * log_alpha).sum(dim=1), location=cell.masked_fill(expectation, -1))


def inverse_cdf(probabilities: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """s_t [B] from uniform draws [B]: the first category whose cumulative probability strictly exceeds
    the draw; where rounding leaves the total at or below it, the last of positive probability."""
    cumulative = probabilities.cumsum(dim=1)  # [B, L]
    cell = torch.searchsorted(cumulative, draws[:, None].contiguous(), right=True).squeeze(1)  # [B]
    last = probabilities.shape[1] - 1 - (probabilities > 0).flip(1).int().argmax(dim=1)  # [B]
    return torch.where(cell < probabilities.shape[1], cell, last)


def sample(probabilities: torch.Tensor) -> torch.Tensor:
    """s_t [B] drawn with torch's RNG. A row that is not a distribution (inf or NaN, from a step whose
    loss will not be finite either) is drawn uniformly: its loss, not torch.multinomial, skips the step."""
    valid = torch.isfinite(probabilities).all(dim=1, keepdim=True) & (probabilities.sum(dim=1, keepdim=True) > 0)
    return torch.multinomial(torch.where(valid, probabilities.clamp(min=0), torch.ones_like(probabilities)),
                             1).squeeze(1)


# Sec. 3.1.2: the LSTM decoder ---------------------------------------------------------------------

class MeanAnnotation(nn.Module):
    """What the initial state is computed from: the mean annotation (a seam: extras/layout.py)."""

    def __init__(self, *, annotation_dim: int):
        super().__init__()
        self.dim = annotation_dim

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        return annotations.mean(dim=1)  # [B, D]


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # [B, T, V]
    alphas: torch.Tensor  # [B, T, L]
    log_probs: torch.Tensor | None = None  # [B, T], hard: log p(s_t | a); 0 where the expectation was used
    entropies: torch.Tensor | None = None  # [B, T], hard: H[alpha_t]
    locations: torch.Tensor | None = None  # [B, T] long, hard: s_t; -1 where the expectation was used


class AttentionDecoder(nn.Module):
    """The LSTM that attends at every word. Eq. 7 as printed is linear in h_t and z_t; the authors'
    code puts a tanh before L_o (deep_output="tanh"). beta_t is a scalar; some ports gate each channel
    (gate="vector"). Seams, never asked which they hold: `summary` (what h_0, c_0 come from), `query`
    (q_t), `attention` (soft or hard, any score), `accelerator` (the builder's faster path of the same
    steps, captioning.model.accelerator; None runs `_advance`; its weights are the decoder's)."""

    def __init__(self, *, vocab_size: int, annotation_dim: int, embed_dim: int, hidden_dim: int,
                 attention: nn.Module, gate: str = "scalar", dropout: float = 0.3, deep_output: str = "linear",
                 summary: Callable[..., nn.Module] = MeanAnnotation, query: nn.Module | None = None,
                 accelerator: Any = None):
        super().__init__()
        self.accelerator = accelerator
        self.annotation_dim = annotation_dim  # D
        self.attention = attention
        self.query = query if query is not None else PreviousState()
        self.embed = nn.Embedding(vocab_size, embed_dim)  # E
        self.summary = summary(annotation_dim=annotation_dim)
        self.init_h = nn.Linear(self.summary.dim, hidden_dim)  # f_init,h
        self.init_c = nn.Linear(self.summary.dim, hidden_dim)  # f_init,c
        context_dim = attention.context_dim(annotation_dim)  # the width of z_t
        self.gate = nn.Linear(hidden_dim, 1 if gate == "scalar" else context_dim)  # f_beta
        self.lstm = nn.LSTMCell(embed_dim + context_dim, hidden_dim)
        self.out_h = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_z = nn.Linear(context_dim, embed_dim, bias=False)  # L_z
        self.out = nn.Linear(embed_dim, vocab_size)  # L_o
        self.deep_output = deep_output
        self.deep = nn.Tanh() if deep_output == "tanh" else nn.Identity()  # before L_o
        self.dropout = nn.Dropout(dropout)

    def start(self, annotations: torch.Tensor, draws: Draws | None = None) -> tuple[Memory, DecoderState]:
        """The per-image work: attention's keys and the initial state (Sec. 3.1.2), from [B, L, D]."""
        summary = self.summary(annotations)  # [B, D], the mean annotation
        state = DecoderState(h=torch.tanh(self.init_h(summary)), c=self.init_c(summary))
        return self.attention.start(annotations, draws=draws), state

    def prepare(self, annotations: torch.Tensor, draws: Draws | None = None) -> tuple[Memory, DecoderState]:
        """`start`'s old name (it is also a command), kept for scripts that call it."""
        warnings.warn("AttentionDecoder.prepare is now named start (the old name still works)", FutureWarning,
                      stacklevel=2)
        return self.start(annotations, draws=draws)

    def _advance(self, memory: Memory, state: DecoderState,
                 embedded: torch.Tensor) -> tuple[DecoderState, torch.Tensor, AttentionOutput]:
        """One step of the recurrence: attend, gate, update the LSTM. embedded [B, E], E y_{t-1}."""
        query, state = self.query(state, embedded)  # q_t, and what the query carries on
        attended = self.attention(memory, query)  # Eqs. 4-6
        z = torch.sigmoid(self.gate(state.h)) * attended.context  # [B, D], beta_t z_t (Sec. 4.2.1)
        h, c = self.lstm(torch.cat([embedded, z], dim=1), (state.h, state.c))  # Eqs. 1-3
        return DecoderState(h, c, state.carried), z, attended

    def word_logits(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The deep output layer, Eq. 7, on [B, E] or [N, E] alike."""
        hidden = self.deep(embedded + self.out_h(self.dropout(h)) + self.out_z(z))
        return self.out(self.dropout(hidden))

    def next_word(self, memory: Memory, state: DecoderState,
                  tokens: torch.Tensor) -> tuple[torch.Tensor, DecoderState, AttentionOutput]:
        """One word when decoding: previous tokens [B] -> logits [B, V], the new state, attention."""
        embedded = self.embed(tokens)  # [B, E]
        state, z, attended = self._advance(memory, state, embedded)
        return self.word_logits(embedded, state.h, z), state, attended

    def forward(self, annotations: torch.Tensor, inputs: torch.Tensor, *,
                lengths: torch.Tensor | None = None, draws: Draws | None = None) -> DecoderOutput:
        """Teacher forcing: annotations [B, L, D], inputs [B, T] (<start> w_1 ..), `lengths` [B] each row's
        real steps (zeros past them), `draws` hard attention's randomness (model/packing.py runs it)."""
        return DecoderOutput(**teacher_forced(self, annotations, inputs, lengths=lengths, draws=draws))


# Eq. 14 and Sec. 4.1: the loss --------------------------------------------------------------------

def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, *,
                  word_weights: torch.Tensor | None = None) -> torch.Tensor:
    """-log p(y|a) per real target word. logits [B, T, V], targets/mask [B, T]. `word_weights` [V] (not
    the paper's) weight each word's term; divided by the real words still, so that every term keeps its proportion."""
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)  # [B, T]
    weighted = mask if word_weights is None else mask * word_weights[targets]  # [B, T]
    return (nll * weighted).sum() / mask.sum()


def doubly_stochastic(alphas: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_i (1 - sum_t alpha_ti)^2 of each caption (Eq. 14), summed and divided by the real words as
    `cross_entropy` is: train.ds_lambda is the paper's lambda. alphas [B, T, L]. A tau that depends on
    the caption's length would move the term by a constant, the same gradient (tests/train/test_losses.py)."""
    mask = mask.to(alphas.dtype)
    totals = (alphas * mask[:, :, None]).sum(dim=1)  # [B, L], sum_t alpha_ti over real steps
    return ((1 - totals) ** 2).sum() / mask.sum()


def caption_log_likelihood(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(y|s,a) of each caption [B]: its real words' log-probabilities summed. logits [B, T, V]."""
    words = torch.log_softmax(logits.float(), dim=2).gather(2, targets[:, :, None]).squeeze(2)  # [B, T]
    return (words * mask).sum(dim=1)


def leave_one_out(rewards: torch.Tensor, counted: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's baseline, the mean reward of the other counted samples of its group [G, K] (0
    where none), and how many there are [G, K]. counted [G, K] bool (None: all)."""
    counted = torch.ones_like(rewards, dtype=torch.bool) if counted is None else counted
    r = torch.where(counted, rewards, torch.zeros_like(rewards))  # [G, K]
    c = counted.to(rewards.dtype)
    others = c.sum(dim=1, keepdim=True) - c  # [G, K]
    return (r.sum(dim=1, keepdim=True) - r) / others.clamp(min=1), others


@dataclass(frozen=True)
class ReinforceTerms:
    loss: torch.Tensor  # the surrogate, a scalar on the device
    stats: dict[str, float]  # what a run logs
    sampled: float  # captions of the global batch that sampled locations
    reward: float  # their mean reward (0 when none did), what `move` moves b by


class Reinforce:
    """Hard attention's terms of the gradient of the bound L_s (Sec. 4.1, Eq. 12). Per caption y
    with sampled locations s~:
        d log p(y|s~,a) + lambda_r (log p(y|s~,a) - b) d log p(s~|a) + lambda_e d H[s~].
    The first term is the word cross-entropy; `__call__` returns a surrogate whose gradient is minus
    the other two, summed over captions and divided by the real words as `cross_entropy` is:
        -[lambda_r sum_n (r_n - b_n) sum_t m_nt log p(s_nt) + lambda_e sum_n sum_t m_nt H_nt] / sum m.
    r_n = log p(y_n|s~_n, a), detached. Captions that used the expectation get no term and do not move b.
    Baselines: "moving_average" (the paper's b <- decay b + (1 - decay) mean_n r_n, `move`d once a step
    is applied), "leave_one_out" (the mean reward of a caption's other `location_samples` replicas),
    "none". `weight_warmup` (not the paper's) ramps both terms in; `across` sums over processes."""

    def __init__(self, *, weight: float = 1.0, entropy_weight: float = 0.0, baseline: str = "moving_average",
                 baseline_decay: float = 0.9, location_samples: int = 1, weight_warmup: int = 0,
                 across: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor):
        self.weight, self.entropy_weight = weight, entropy_weight
        self.baseline, self.decay = baseline, baseline_decay
        self.location_samples, self.weight_warmup = location_samples, weight_warmup
        self.value: float | None = None  # the moving average b; None until the first sampled batch
        self.across = across

    @classmethod
    def from_config(cls, reinforce: ReinforceConfig, *,
                    across: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor) -> Reinforce:
        return cls(weight=reinforce.weight, entropy_weight=reinforce.entropy_weight, baseline=reinforce.baseline,
                   baseline_decay=reinforce.baseline_decay, location_samples=reinforce.location_samples,
                   weight_warmup=reinforce.weight_warmup, across=across)

    def pooled(self, rewards: torch.Tensor, sampled: torch.Tensor, *, counted: bool = True) -> torch.Tensor:
        """[2]: the sampled captions' summed rewards and number over every process; 0 where not `counted`."""
        local = torch.stack([torch.where(sampled, rewards, torch.zeros_like(rewards)).sum(),
                             sampled.sum().to(rewards.dtype)])
        return self.across(local * float(counted))

    def baselines(self, rewards: torch.Tensor, sampled: torch.Tensor,
                  pooled: torch.Tensor | None = None) -> torch.Tensor:
        """b_n [B] for rewards [B] (sampled [B] bool); b itself is not moved."""
        if self.baseline == "none":
            return torch.zeros_like(rewards)
        if self.value is None:  # first batch: its own mean, not 0 (rewards are sums of log-probs, ~ -10)
            pooled = self.pooled(rewards, sampled) if pooled is None else pooled
            moving = (pooled[0] / pooled[1].clamp(min=1)).expand_as(rewards)  # [B], on the device
        else:
            moving = torch.full_like(rewards, self.value)  # [B]
        if self.baseline == "moving_average":
            return moving
        k = self.location_samples
        loo, others = leave_one_out(rewards.view(-1, k), sampled.view(-1, k))  # [images, K]
        return torch.where(others > 0, loo, moving.reshape(loo.shape)).view(-1)

    def move(self, terms: ReinforceTerms) -> None:
        """b <- decay b + (1 - decay) mean reward, after an applied step that sampled a finite mean."""
        if terms.sampled == 0 or not math.isfinite(terms.reward):
            return
        self.value = terms.reward if self.value is None else self.decay * self.value + (1 - self.decay) * terms.reward

    def scale(self, step: int) -> float:
        """How much of both terms counts at the run's `step` (steps done before this one)."""
        return min(1.0, (step + 1) / self.weight_warmup) if self.weight_warmup else 1.0

    def __call__(self, *, logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, log_probs: torch.Tensor,
                 entropies: torch.Tensor, locations: torch.Tensor, step: int = 0,
                 counted: bool = True) -> ReinforceTerms:
        """The surrogate and statistics. log_probs/entropies/locations [B, T] (DecoderOutput)."""
        mask = mask.to(log_probs.dtype)
        rewards = caption_log_likelihood(logits.detach(), targets, mask)  # [B], r_n
        sampled = (locations >= 0).any(dim=1)  # [B]; the coin is per caption
        pooled = self.pooled(rewards, sampled, counted=counted)  # [2]
        baselines = self.baselines(rewards, sampled, pooled)  # [B]
        advantage = torch.where(sampled, rewards - baselines, torch.zeros_like(rewards))  # chosen: 0 * NaN is NaN
        steps = mask * sampled[:, None]  # [B, T], real steps of captions that sampled
        score_function = (advantage[:, None] * log_probs * steps).sum()  # sum_n (r_n - b_n) log p(s~_n|a)
        entropy = (entropies * steps).sum()  # sum_n H[s~_n]
        scale = self.scale(step)
        loss = -scale * (self.weight * score_function + self.entropy_weight * entropy) / mask.sum()
        # What the move and the statistics need, in one trip to the host (on a GPU each trip waits).
        loss_value, count, reward, share, entropy_value, compared = floats(
            loss, pooled[1], pooled[0] / pooled[1].clamp(min=1), sampled.float().mean(),
            entropy / steps.sum().clamp(min=1),
            torch.where(sampled, baselines, torch.zeros_like(baselines)).sum() / sampled.sum().clamp(min=1))
        stats = {"reinforce": loss_value, "reward": reward, "baseline": compared if share else (self.value or 0.0),
                 "sampled": share, "reinforce_scale": scale, "entropy": entropy_value}
        return ReinforceTerms(loss=loss, stats=stats, sampled=count, reward=reward)

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.value}  # b must survive a resume

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A baseline that is not finite starts again from the next batch's mean."""
        value = state.get("baseline")
        self.value = float(value) if value is not None and math.isfinite(float(value)) else None
