"""Attention over the annotation grid: a *score* function and a way of *using* the weights.

Notation: B batch, L grid cells (Hg x Wg), D annotation channels, Q query size, A attention size.

The score (captioning.model.scores) says how well each cell a_i matches the query,
e_ti = score(h_{t-1}, a_i) (Eq. 4); alpha_t = softmax(e_t) (Eq. 5). Soft attention takes the
expectation of the annotations under alpha (Sec. 4.2); hard attention samples one cell
s_t ~ Categorical(alpha_t) and uses a_{s_t} (Sec. 4.1). Both return the same AttentionOutput, so
the decoder never asks which kind it holds, and every score works with both.

Whatever depends only on the image (e.g. W_a a_i in the additive score) is computed once per image
in `start`, not once per word: it is the largest tensor in the step, and recomputing it every
step is where the popular ports lose most of their time.

Seams for options that are not in the paper (captioning/model/extras): `inputs`, what attention
sees of the annotations (the paper: the annotations as they are), and `temperature`, alpha_t =
softmax(e_t / tau) (the paper: tau = 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from captioning.config.checks import hard_choice_problem
from captioning.config.schema import ConfigError


@dataclass
class Memory:
    """What attention needs of one batch of images, computed once per image."""

    annotations: torch.Tensor  # [B, L, D], as attention sees them (after `inputs`)
    keys: torch.Tensor | None  # the score's image-side work, e.g. [B, L, A]; None for `location`
    # Hard attention while training: True where this image uses the soft expectation instead of a
    # sample for its whole caption (Sec. 4.1: "with probability 0.5"). None otherwise.
    expectation: torch.Tensor | None = None  # [B] bool
    # Hard attention while training, where the step hands them in (Draws.cells): each row's uniform
    # draws for its cells, one column per step. None: torch's RNG.
    draws: torch.Tensor | None = None  # [B, T]
    t: int = 0  # the caption's time steps taken with this memory so far: the column of `draws` read next

    def select(self, index: torch.Tensor) -> Memory:
        """Rows of the batch, e.g. each image repeated once per beam."""

        def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.index_select(0, index)

        return Memory(pick(self.annotations), pick(self.keys), pick(self.expectation), pick(self.draws), self.t)

    def prefix(self, rows: int) -> Memory:
        """The first `rows` images, as views (no copy): the rows still running when sorted by length."""

        def first(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[:rows]

        return Memory(first(self.annotations), first(self.keys), first(self.expectation), first(self.draws), self.t)


@dataclass
class AttentionOutput:
    context: torch.Tensor  # [B, D], z_t before the gate
    alpha: torch.Tensor  # [B, L], the attention map softmax(e_t), a distribution for both kinds
    log_prob: torch.Tensor | None = None  # [B], log alpha_t[s_t] (hard only; 0 where the expectation was used)
    entropy: torch.Tensor | None = None  # [B], H[alpha_t] (hard only)
    location: torch.Tensor | None = None  # [B] long, the chosen cell s_t, -1 where the expectation was used (hard)

    @property
    def weights(self) -> torch.Tensor:
        """The weights the context was formed with, [B, L]: one-hot at s_t where a cell was chosen,
        alpha where the expectation was used. context = sum_i weights_i a_i for both kinds."""
        if self.location is None:
            return self.alpha
        one_hot = F.one_hot(self.location.clamp(min=0), self.alpha.shape[1]).to(self.alpha.dtype)  # [B, L]
        return torch.where((self.location >= 0)[:, None], one_hot, self.alpha)


@dataclass
class Draws:
    """Hard attention's randomness for one training forward, as the training step hands it in (Sec. 4.1).

    `expectation_prob`: the probability that a caption uses the soft expectation instead of
    samples, at this point of the run (model.hard.expectation_prob, the paper's 0.5; the training
    step owns its warm-up: captioning.train.step.expectation_prob_at). `coins`: each row's uniform
    draw that decides it (a row uses the expectation where coin < expectation_prob), already shared
    out one per image or per batch (shared_coins); None: `start` flips them with torch's RNG.
    `cells`: each row's uniform draws that pick its cell at every step by inverse CDF, so that a
    run's samples do not depend on how it splits or orders its batch; None: torch's RNG samples them.
    """

    expectation_prob: float
    coins: torch.Tensor | None = None  # [B], uniform in [0, 1)
    cells: torch.Tensor | None = None  # [B, T], uniform in [0, 1)

    @classmethod
    def from_uniform(cls, uniform: torch.Tensor, *, expectation_prob: float) -> Draws:
        """From uniform draws [B, 1 + T]: column 0 each row's coin, then one column per step."""
        return cls(expectation_prob=expectation_prob, coins=uniform[:, 0], cells=uniform[:, 1:])

    def select(self, index: torch.Tensor) -> Draws:
        """Rows of the batch (the decoder sorts them by caption length)."""

        def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.index_select(0, index)

        return Draws(self.expectation_prob, pick(self.coins), pick(self.cells))


class _Attention(nn.Module):
    """What soft and hard attention share: the per-image work and the weights alpha_t.

    `inputs`: modules applied, in order, to the annotations before the score sees them (the paper:
    none); each may append `channels` to every annotation, which widen the context z_t.
    """

    def __init__(self, score: nn.Module, *, temperature: float = 1.0, inputs: tuple[nn.Module, ...] = ()):
        super().__init__()
        self.score = score
        self.temperature = temperature
        self.inputs = nn.Sequential(*inputs)  # empty: the annotations as they are

    def context_dim(self, annotation_dim: int) -> int:
        """The width of z_t for annotations of `annotation_dim` channels."""
        return annotation_dim + sum(getattr(module, "channels", 0) for module in self.inputs)

    def start(self, annotations: torch.Tensor, draws: Draws | None = None) -> Memory:
        """The per-image work for annotations [B, L, D]. `draws`: hard attention's randomness while
        training (soft attention samples nothing and ignores them)."""
        annotations = self.inputs(annotations)  # [B, L, D]
        return Memory(annotations=annotations, keys=self.score.keys(annotations))

    def log_weights(self, memory: Memory, query: torch.Tensor) -> torch.Tensor:
        """log alpha_t [B, L] = log_softmax(e_t / tau), Eqs. 4-5."""
        return torch.log_softmax(self.score(memory.keys, query) / self.temperature, dim=1)


class SoftAttention(_Attention):
    """Deterministic soft attention (Sec. 4.2): z_t = sum_i alpha_ti a_i."""

    def forward(self, memory: Memory, query: torch.Tensor) -> AttentionOutput:
        alpha = self.log_weights(memory, query).exp()  # [B, L], Eq. 5
        context = torch.bmm(alpha[:, None, :], memory.annotations).squeeze(1)  # [B, D], Eq. 13
        return AttentionOutput(context=context, alpha=alpha)


class HardAttention(_Attention):
    """Stochastic hard attention (Sec. 4.1): s_t ~ Categorical(alpha_t), z_t = a_{s_t}.

    Training: each image flips one coin for its whole caption; with probability
    `expectation_prob` (0.5 in the paper) it uses the soft expectation sum_i alpha_ti a_i instead of
    samples. The authors' code flipped one coin per batch (`coin="batch"`). Rows that used the
    expectation sampled nothing: their log_prob is exactly 0, so the REINFORCE term
    (captioning.train.losses) gets nothing from them, and their location is -1.

    The module holds no training schedule. Without `draws`, `start` flips each row's coin at
    `expectation_prob` (each row one image). A training step hands its `Draws` in: the probability of the
    expectation where the run warms it up (model.hard.warmup: captioning.train.step.expectation_prob_at),
    and a run's own coins, shared out one per image (the K rows of an image's K samples of
    locations) or one per global batch (`shared_coins`), with the draws for its cells.

    Test time (eval mode): `choice` says how the cell is picked: "expectation" (the default, the
    paper's: it behaves like soft attention), "argmax" (the most likely cell) or "sample".
    `choosing` changes it for one decoding.
    """

    def __init__(self, score: nn.Module, *, temperature: float = 1.0, inputs: tuple[nn.Module, ...] = (),
                 expectation_prob: float = 0.5, coin: str = "image", choice: str = "expectation"):
        super().__init__(score, temperature=temperature, inputs=inputs)
        self.expectation_prob = expectation_prob
        self.coin = coin
        self.choice = choice

    def start(self, annotations: torch.Tensor, draws: Draws | None = None) -> Memory:
        memory = super().start(annotations)
        if self.training:
            draws = draws if draws is not None else Draws(expectation_prob=self.expectation_prob)  # the paper's mixture
            coins = draws.coins
            if coins is None:  # each row an image with its own coin (or one for all: coin="batch")
                uniform = torch.rand(annotations.shape[0], 1, device=annotations.device)  # [B, 1]
                coins = shared_coins(uniform, group=1, coin=self.coin)[:, 0]  # [B]
            memory.expectation, memory.draws = coins < draws.expectation_prob, draws.cells  # [B] (Sec. 4.1), [B, T]
        return memory

    def _choose(self, alpha: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        """The cell s_t [B] and where the expectation is used instead [B] bool."""
        batch = alpha.shape[0]
        none = torch.zeros(batch, dtype=torch.bool, device=alpha.device)
        if self.training:
            expectation = memory.expectation if memory.expectation is not None else none
            if memory.draws is not None:
                draws = memory.draws[:, memory.t].to(alpha.dtype)  # [B]
                memory.t += 1
                return inverse_cdf(alpha.detach(), draws), expectation
            return sample(alpha.detach()), expectation
        if self.choice == "sample":
            return sample(alpha.detach()), none
        return alpha.argmax(dim=1), none if self.choice == "argmax" else ~none

    def forward(self, memory: Memory, query: torch.Tensor) -> AttentionOutput:
        log_alpha = self.log_weights(memory, query)  # [B, L]
        alpha = log_alpha.exp()  # [B, L]
        cell, expectation = self._choose(alpha, memory)  # [B], [B]
        index = cell[:, None, None].expand(-1, 1, memory.annotations.shape[2])  # [B, 1, D]
        chosen = memory.annotations.gather(1, index).squeeze(1)  # [B, D], a_{s_t}
        expected = torch.bmm(alpha[:, None, :], memory.annotations).squeeze(1)  # [B, D], Eq. 13
        return AttentionOutput(
            context=torch.where(expectation[:, None], expected, chosen),
            alpha=alpha,
            log_prob=log_alpha.gather(1, cell[:, None]).squeeze(1).masked_fill(expectation, 0.0),  # [B]
            entropy=-(alpha * log_alpha).sum(dim=1),  # [B], H[alpha_t]
            location=cell.masked_fill(expectation, -1),
        )


def shared_coins(draws: torch.Tensor, *, group: int, coin: str) -> torch.Tensor:
    """`draws` [R, 1 + T] (Draws.from_uniform) with column 0 made the coin of each row's image:
    the rows come image by image, `group` rows each (an image's K samples of locations), and each
    takes its image's first row's draw; with `coin="batch"` (the authors' code) every row takes row
    0's, one coin for the whole batch. The one place where a run's coins are shared out."""
    rows = draws.shape[0]
    by_image = draws[::group, 0].repeat_interleave(group)[:rows]  # [R]
    coins = draws[:1, 0].expand(rows) if coin == "batch" else by_image  # [R]
    return torch.cat([coins[:, None], draws[:, 1:]], dim=1)


def inverse_cdf(probabilities: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """The category [B] whose cumulative probability first exceeds each uniform draw in [0, 1) [B];
    probabilities [B, L]. Strictly exceeds: a draw of exactly 0 cannot pick a category of probability
    0 ahead of the first one that has some. Where rounding leaves the total at or below the draw, the
    last category of positive probability is taken."""
    cumulative = probabilities.cumsum(dim=1)  # [B, L]
    cell = torch.searchsorted(cumulative, draws[:, None].contiguous(), right=True).squeeze(1)  # [B]
    last = probabilities.shape[1] - 1 - (probabilities > 0).flip(1).int().argmax(dim=1)  # [B]
    return torch.where(cell < probabilities.shape[1], cell, last)


def sample(probabilities: torch.Tensor) -> torch.Tensor:
    """One category per row [B] drawn from probabilities [B, L] with torch's RNG. A row that is not a
    distribution (inf or NaN, from a step whose loss will not be finite either) is drawn uniformly
    instead of stopping the run inside torch.multinomial: its loss is what skips the step."""
    valid = torch.isfinite(probabilities).all(dim=1, keepdim=True) & (probabilities.sum(dim=1, keepdim=True) > 0)
    safe = torch.where(valid, probabilities.clamp(min=0), torch.ones_like(probabilities))  # [B, L]
    return torch.multinomial(safe, 1).squeeze(1)


def hard_attention(module: nn.Module) -> HardAttention | None:
    """The hard attention inside `module`, or None where it attends softly."""
    return next((m for m in module.modules() if isinstance(m, HardAttention)), None)


def refuse_hard_choice(module: nn.Module, choice: str | None, name: str = "this model") -> None:
    """The config's rule on how hard attention picks its cell at test time
    (captioning.config.checks.hard_choice_problem), applied to a choice asked of this model when it
    decodes (an API call's or a command's, not its config's). `name` names the model in the message
    (a checkpoint's path); None asks nothing."""
    if choice is None:
        return
    problem = hard_choice_problem(choice, "soft" if hard_attention(module) is None else "hard")
    if problem is not None:
        raise ConfigError(f"{name}: {problem}")


@contextmanager
def choosing(module: nn.Module, choice: str | None) -> Iterator[None]:
    """Within the block, every HardAttention inside `module` picks its cell by `choice` in eval mode
    ("expectation", "argmax", "sample"; refuse_hard_choice checks it); None changes nothing."""
    refuse_hard_choice(module, choice)
    if choice is None:
        yield
        return
    found = [m for m in module.modules() if isinstance(m, HardAttention)]
    saved = [m.choice for m in found]
    for m in found:
        m.choice = choice
    try:
        yield
    finally:
        for m, previous in zip(found, saved):
            m.choice = previous
