"""Attention over the annotation grid: a *score* function and a way of *using* the weights.

Notation: B batch, L grid cells (Hg x Wg), D annotation channels, H decoder hidden size, A attention size.

The score says how well each cell a_i matches the decoder state, e_ti = score(h_{t-1}, a_i)
(Eq. 4); alpha_t = softmax(e_t / tau) (Eq. 5, tau a temperature, 1 in the paper). Soft attention
takes the expectation of the annotations under alpha (Sec. 4.2); hard attention samples one cell
s_t ~ Categorical(alpha_t) and uses a_{s_t} (Sec. 4.1). Both return the same AttentionOutput, so
the decoder never asks which kind it holds, and every score works with both.

Whatever depends only on the image (e.g. W_a a_i in the additive score) is computed once per image
in `prepare`, not once per word: it is the largest tensor in the step, and recomputing it every
step is where the popular ports lose most of their time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Memory:
    """What attention needs of one batch of images, computed once per image."""

    annotations: torch.Tensor  # [B, L, D], with the 2-D position added where configured
    keys: torch.Tensor | None  # the score's image-side work, e.g. [B, L, A]; None for `location`
    # Hard attention while training: True where this image uses the soft expectation instead of a
    # sample for its whole caption (Sec. 4.1: "with probability 0.5"). None otherwise.
    expectation: torch.Tensor | None = None  # [B] bool

    def select(self, index: torch.Tensor) -> Memory:
        """Rows of the batch, e.g. each image repeated once per beam."""

        def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.index_select(0, index)

        return Memory(pick(self.annotations), pick(self.keys), pick(self.expectation))

    def prefix(self, rows: int) -> Memory:
        """The first `rows` images, as views (no copy): the rows still running when sorted by length."""

        def first(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[:rows]

        return Memory(first(self.annotations), first(self.keys), first(self.expectation))


@dataclass
class AttentionOutput:
    context: torch.Tensor  # [B, D], z_t before the gate
    alpha: torch.Tensor  # [B, L], the attention map softmax(e_t / tau), a distribution for both kinds
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


# Scores ------------------------------------------------------------------------------------------
#
# Every score takes the same keyword arguments (so that SCORES can build any of them alike) and has
#   prepare(annotations [B, L, D]) -> keys, the image-only work, once per image;
#   forward(keys, hidden [B, H]) -> e [B, L], once per step.
# `grid` (Hg, Wg) is needed only by the scores that know where cells are (location, local).


def _query(hidden_dim: int, annotation_dim: int) -> nn.Module:
    """q = h when the sizes agree, else a learned projection W_q h (Luong's dot needs H == D)."""
    return nn.Identity() if hidden_dim == annotation_dim else nn.Linear(hidden_dim, annotation_dim, bias=False)


def _check_cells(annotations: torch.Tensor, cells: int, name: str) -> None:
    if annotations.shape[1] != cells:
        raise ValueError(f"the {name} score was built for {cells} grid cells, got annotations with "
                         f"{annotations.shape[1]}")


class AdditiveScore(nn.Module):
    """Bahdanau's score, the paper's f_att: e_ti = v^T tanh(W_a a_i + W_h h_{t-1})."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        self.key = nn.Linear(annotation_dim, attention_dim)  # W_a (and the bias)
        self.query = nn.Linear(hidden_dim, attention_dim, bias=False)  # W_h
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def prepare(self, annotations: torch.Tensor) -> torch.Tensor:
        return self.key(annotations)  # [B, L, A], once per image

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = self.query(hidden)  # [B, A]
        return self.v(torch.tanh(keys + query[:, None, :])).squeeze(2)  # [B, L]


class ConcatScore(nn.Module):
    """Luong's concat: e_ti = v^T tanh(W [h_{t-1}; a_i] + b), one matrix W over the concatenation.

    As a function this is the additive score in another parametrization: W [h; a] = W_h h + W_a a,
    and we split W into those two column blocks so that the a-block runs once per image. (Luong's
    concat differs from Bahdanau's by scoring the *current* h_t, which this decoder cannot do: z_t
    is an input of the LSTM that makes h_t.)
    """

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.W = nn.Linear(hidden_dim + annotation_dim, attention_dim)  # W over [h; a], with b
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def prepare(self, annotations: torch.Tensor) -> torch.Tensor:
        W_a = self.W.weight[:, self.hidden_dim:]  # [A, D], the annotation block of W
        return annotations @ W_a.T + self.W.bias  # [B, L, A], once per image

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = hidden @ self.W.weight[:, : self.hidden_dim].T  # [B, A], the hidden block of W
        return self.v(torch.tanh(keys + query[:, None, :])).squeeze(2)  # [B, L]


class GeneralScore(nn.Module):
    """Luong's general (bilinear) score: e_ti = h_{t-1}^T W a_i; W a_i runs once per image."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        self.W = nn.Linear(annotation_dim, hidden_dim, bias=False)  # W [H, D]

    def prepare(self, annotations: torch.Tensor) -> torch.Tensor:
        return self.W(annotations)  # [B, L, H]

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.bmm(keys, hidden[:, :, None]).squeeze(2)  # [B, L]


class DotScore(nn.Module):
    """Luong's dot score: e_ti = q^T a_i, q = h_{t-1} (or W_q h_{t-1} when H != D)."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        self.query = _query(hidden_dim, annotation_dim)
        self.scale = 1.0

    def prepare(self, annotations: torch.Tensor) -> torch.Tensor:
        return annotations  # [B, L, D]: nothing to precompute, the keys are the annotations

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = self.query(hidden)  # [B, D]
        return torch.bmm(keys, query[:, :, None]).squeeze(2) * self.scale  # [B, L]


class ScaledDotScore(DotScore):
    """Vaswani et al.'s scaled dot product: e_ti = q^T a_i / sqrt(D), which keeps the softmax out of
    saturation when D is large."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__(annotation_dim=annotation_dim, hidden_dim=hidden_dim, attention_dim=attention_dim)
        self.scale = 1.0 / math.sqrt(annotation_dim)


class CosineScore(nn.Module):
    """Graves' content-based score: e_ti = beta * cos(q, a_i), q = h_{t-1} (or W_q h_{t-1}).

    A cosine lies in [-1, 1], so over L = 196 cells its softmax is nearly flat; a sharpness
    beta > 0 (learned by default, through log beta) lets the map become peaked.
    """

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None, sharpness: float = 5.0, learn_sharpness: bool = True):
        super().__init__()
        self.query = _query(hidden_dim, annotation_dim)
        log_sharpness = torch.tensor(math.log(sharpness))
        if learn_sharpness:
            self.log_sharpness = nn.Parameter(log_sharpness)
        else:
            self.register_buffer("log_sharpness", log_sharpness)

    def prepare(self, annotations: torch.Tensor) -> torch.Tensor:
        return F.normalize(annotations, dim=2)  # [B, L, D], unit annotations, once per image

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = F.normalize(self.query(hidden), dim=1)  # [B, D]
        return self.log_sharpness.exp() * torch.bmm(keys, query[:, :, None]).squeeze(2)  # [B, L]


class LocationScore(nn.Module):
    """Luong's location-based score: e_t = W_loc h_{t-1} + b, one number per cell; the content of
    the cells is ignored, so it can only learn *where* captions tend to look at each step."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        if grid is None:
            raise ValueError("the location score needs the grid (Hg, Wg): it has one output per cell")
        self.cells = grid[0] * grid[1]
        self.W = nn.Linear(hidden_dim, self.cells)  # W_loc

    def prepare(self, annotations: torch.Tensor) -> None:
        _check_cells(annotations, self.cells, "location")
        return None  # nothing image-side: the score ignores the annotations

    def forward(self, keys: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
        return self.W(hidden)  # [B, L]


class LocalScore(nn.Module):
    """Luong's local-p attention in 2-D: a base score plus the log of a Gaussian window.

      p_t  = (Hg, Wg) * sigmoid(W_p tanh(V_p h_{t-1}))        the predicted centre, in cell units
      e_ti = base(h_{t-1}, a_i) - ||c_i - p_t||^2 / (2 sigma^2)   c_i the centre of cell i

    so alpha_t ∝ softmax(base)_i * exp(-||c_i - p_t||^2 / 2 sigma^2): Luong's window multiplied into
    the weights, then renormalized, because alpha must stay a distribution (hard attention samples
    from it). sigma defaults to a quarter of the grid's longer side (3.5 cells at 14x14).
    """

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None, base: str = "additive", sigma: float | None = None):
        super().__init__()
        if grid is None:
            raise ValueError("the local score needs the grid (Hg, Wg): its window lives on the grid")
        if base not in SCORES or base == "local":
            raise ValueError(f"unknown base score '{base}' for the local score "
                             f"(known: {', '.join(s for s in SCORES if s != 'local')})")
        self.base = SCORES[base](annotation_dim=annotation_dim, hidden_dim=hidden_dim, attention_dim=attention_dim,
                                 grid=grid)
        self.centre = nn.Sequential(nn.Linear(hidden_dim, attention_dim), nn.Tanh(),  # V_p
                                    nn.Linear(attention_dim, 2))  # W_p: (row, column)
        rows, columns = torch.meshgrid(torch.arange(grid[0]) + 0.5, torch.arange(grid[1]) + 0.5, indexing="ij")
        # Fixed geometry, not weights: kept out of the state dict, but moved by .to(device/dtype).
        self.register_buffer("cells", torch.stack([rows, columns], dim=2).view(-1, 2), persistent=False)  # [L, 2]
        self.register_buffer("extent", torch.tensor([float(grid[0]), float(grid[1])]), persistent=False)  # [2]
        self.sigma = float(sigma) if sigma is not None else max(grid) / 4

    def prepare(self, annotations: torch.Tensor) -> torch.Tensor | None:
        _check_cells(annotations, self.cells.shape[0], "local")
        return self.base.prepare(annotations)

    def centre_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """p_t [B, 2] in cell units: (row, column), each in (0, Hg) x (0, Wg)."""
        return self.extent * torch.sigmoid(self.centre(hidden))

    def forward(self, keys: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
        distance2 = ((self.cells[None] - self.centre_of(hidden)[:, None]) ** 2).sum(2)  # [B, L]
        return self.base(keys, hidden) - distance2 / (2 * self.sigma ** 2)  # [B, L], log of the window added


# Optional 2-D position ---------------------------------------------------------------------------


class GridPosition(nn.Module):
    """A learned 2-D position added to every annotation: a_i + r_row(i) + c_col(i).

    Deep CNN features say *what* is in a cell far better than *where* the cell is; with this, the
    context z_t carries the position of what was attended, which spatial words ("left of") need.
    An option (model.position=learned), off by default.
    """

    def __init__(self, *, grid: tuple[int, int], annotation_dim: int):
        super().__init__()
        self.rows = nn.Parameter(0.02 * torch.randn(grid[0], annotation_dim))  # [Hg, D]
        self.columns = nn.Parameter(0.02 * torch.randn(grid[1], annotation_dim))  # [Wg, D]

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        position = (self.rows[:, None, :] + self.columns[None, :, :]).flatten(0, 1)  # [L, D]
        _check_cells(annotations, position.shape[0], "2-D position of the")
        return annotations + position  # [B, L, D]


# Using the weights: soft and hard ------------------------------------------------------------------


class _Attention(nn.Module):
    """What soft and hard attention share: the per-image work and the weights alpha_t.

    `unit_annotations` rescales every annotation to norm sqrt(D) before attention sees it. On the
    shapes data, cells on an object have ~1.7x the norm of background cells (docs/attention.md), so
    a sampled object cell jolts a young decoder more than a background cell: REINFORCE then learns
    to *avoid* objects. With equal norms a cell is worth sampling for what it says, not how loudly.
    """

    def __init__(self, score: nn.Module, *, temperature: float = 1.0, position: nn.Module | None = None,
                 unit_annotations: bool = False):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"the softmax temperature must be positive, got {temperature}")
        self.score = score
        self.temperature = temperature
        self.position = position
        self.unit_annotations = unit_annotations

    def prepare(self, annotations: torch.Tensor) -> Memory:
        if self.unit_annotations:
            annotations = F.normalize(annotations, dim=2) * math.sqrt(annotations.shape[2])  # [B, L, D]
        if self.position is not None:
            annotations = self.position(annotations)  # [B, L, D]
        return Memory(annotations=annotations, keys=self.score.prepare(annotations))

    def log_weights(self, memory: Memory, hidden: torch.Tensor) -> torch.Tensor:
        """log alpha_t [B, L] = log_softmax(e_t / tau), Eqs. 4-5."""
        return torch.log_softmax(self.score(memory.keys, hidden) / self.temperature, dim=1)


class SoftAttention(_Attention):
    """Deterministic soft attention (Sec. 4.2): z_t = sum_i alpha_ti a_i."""

    def forward(self, memory: Memory, hidden: torch.Tensor) -> AttentionOutput:
        alpha = self.log_weights(memory, hidden).exp()  # [B, L], Eq. 5
        context = torch.bmm(alpha[:, None, :], memory.annotations).squeeze(1)  # [B, D], Eq. 13
        return AttentionOutput(context=context, alpha=alpha)


class HardAttention(_Attention):
    """Stochastic hard attention (Sec. 4.1): s_t ~ Categorical(alpha_t), z_t = a_{s_t}.

    Training: each image flips one coin for its whole caption; with probability
    `expectation_prob` (0.5 in the paper) it uses the soft expectation sum_i alpha_ti a_i instead of
    samples. The authors' code flipped one coin per batch (`coin="batch"`). Rows that used the
    expectation sampled nothing: their log_prob is exactly 0, so the REINFORCE term (losses.py)
    gets nothing from them, and their location is -1.

    `warmup` > 0 (not in the paper): the chance of the expectation falls linearly from 1 to
    `expectation_prob` over the first `warmup` training batches, so attention first learns where
    objects are the soft way; sampling from a flat map first teaches the decoder the background,
    and REINFORCE then learns to avoid objects (docs/attention.md). The count of batches is a
    buffer, so it is saved in checkpoints and a resumed run continues the schedule.

    Test time (eval mode): `inference` says how the cell is picked: "expectation" (the default,
    the paper's choice: it behaves like soft attention), "argmax" (the most likely cell) or
    "sample". See `hard_inference` to change it for one decoding.
    """

    CHOICES = ("expectation", "argmax", "sample")
    COINS = ("image", "batch")

    def __init__(self, score: nn.Module, *, temperature: float = 1.0, position: nn.Module | None = None,
                 unit_annotations: bool = False, expectation_prob: float = 0.5, coin: str = "image",
                 inference: str = "expectation", warmup: int = 0):
        super().__init__(score, temperature=temperature, position=position, unit_annotations=unit_annotations)
        if not 0.0 <= expectation_prob <= 1.0:
            raise ValueError(f"expectation_prob must lie in [0, 1], got {expectation_prob}")
        if coin not in self.COINS:
            raise ValueError(f"unknown coin '{coin}' (known: {', '.join(self.COINS)})")
        if inference not in self.CHOICES:
            raise ValueError(f"unknown hard attention choice '{inference}' (known: {', '.join(self.CHOICES)})")
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0 batches, got {warmup}")
        self.expectation_prob = expectation_prob
        self.coin = coin
        self.inference = inference
        self.warmup = warmup
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))  # training batches seen

    def current_expectation_prob(self) -> float:
        """The chance of the expectation now: expectation_prob, or on the way there during warm-up."""
        if self.warmup == 0:
            return self.expectation_prob
        done = min(1.0, int(self.batches) / self.warmup)
        return 1.0 - (1.0 - self.expectation_prob) * done

    def prepare(self, annotations: torch.Tensor) -> Memory:
        memory = super().prepare(annotations)
        if self.training:
            batch, device = annotations.shape[0], annotations.device
            draws = torch.rand(1 if self.coin == "batch" else batch, device=device)  # Sec. 4.1
            memory.expectation = (draws < self.current_expectation_prob()).expand(batch)  # [B]
            self.batches += 1
        return memory

    def _choose(self, alpha: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        """The cell s_t [B] and where the expectation is used instead [B] bool."""
        batch = alpha.shape[0]
        none = torch.zeros(batch, dtype=torch.bool, device=alpha.device)
        if self.training:
            expectation = memory.expectation if memory.expectation is not None else none
            return torch.multinomial(alpha.detach(), 1).squeeze(1), expectation
        if self.inference == "sample":
            return torch.multinomial(alpha.detach(), 1).squeeze(1), none
        return alpha.argmax(dim=1), none if self.inference == "argmax" else ~none

    def forward(self, memory: Memory, hidden: torch.Tensor) -> AttentionOutput:
        log_alpha = self.log_weights(memory, hidden)  # [B, L]
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


class GivenLocations(HardAttention):
    """Hard attention whose "samples" are given: row n takes cell sequences[n, t] at step t.

    For analysis rather than training: it enumerates every location sequence of a small problem
    (the exact gradient of the bound, Sec. 4.1) or replays the same samples in another batch layout.
    Rows are taken in the order given, every row at every step: run the decoder's teacher-forced
    forward without `lengths` (which would sort the rows and drop finished ones).
    """

    def __init__(self, score: nn.Module, sequences: torch.Tensor):
        super().__init__(score, expectation_prob=0.0)
        self.sequences, self.t = sequences, 0  # [B, T] long

    def prepare(self, annotations: torch.Tensor) -> Memory:
        self.t = 0
        return super().prepare(annotations)

    def _choose(self, alpha: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        cell = self.sequences[:, self.t]  # [B]
        self.t += 1
        return cell, torch.zeros_like(cell, dtype=torch.bool)


@contextmanager
def hard_inference(module: nn.Module, choice: str | None) -> Iterator[None]:
    """Within the block, every HardAttention inside `module` picks its cell by `choice` in eval mode
    ("expectation", "argmax", "sample"); None changes nothing. Soft attention *is* the expectation,
    so asking a soft model for argmax or sampling is an error rather than silently ignored."""
    if choice is None:
        yield
        return
    if choice not in HardAttention.CHOICES:
        raise ValueError(f"unknown hard attention choice '{choice}' (known: {', '.join(HardAttention.CHOICES)})")
    found = [m for m in module.modules() if isinstance(m, HardAttention)]
    if not found and choice != "expectation":
        raise ValueError(f"'{choice}' applies to hard attention only; this model uses soft attention")
    saved = [m.inference for m in found]
    for m in found:
        m.inference = choice
    try:
        yield
    finally:
        for m, previous in zip(found, saved):
            m.inference = previous


SCORES: dict[str, type[nn.Module]] = {
    "additive": AdditiveScore, "concat": ConcatScore, "general": GeneralScore, "dot": DotScore,
    "scaled_dot": ScaledDotScore, "cosine": CosineScore, "location": LocationScore, "local": LocalScore,
}
ATTENTION: dict[str, type[_Attention]] = {"soft": SoftAttention, "hard": HardAttention}
POSITIONS = ("none", "learned")


def build_attention(*, kind: str = "soft", score: str = "additive", annotation_dim: int, hidden_dim: int,
                    attention_dim: int, grid: tuple[int, int] | None = None, temperature: float = 1.0,
                    position: str = "none", local_base: str = "additive", unit_annotations: bool = False,
                    expectation_prob: float = 0.5, coin: str = "image", warmup: int = 0) -> _Attention:
    """Any score with either kind. `grid` is needed by the location and local scores and the 2-D
    position; `expectation_prob` and `coin` concern hard attention only."""
    if score not in SCORES:
        raise ValueError(f"unknown attention score '{score}' (known: {', '.join(SCORES)})")
    if kind not in ATTENTION:
        raise ValueError(f"unknown attention kind '{kind}' (known: {', '.join(ATTENTION)})")
    if position not in POSITIONS:
        raise ValueError(f"unknown attention position '{position}' (known: {', '.join(POSITIONS)})")
    dims = {"annotation_dim": annotation_dim, "hidden_dim": hidden_dim, "attention_dim": attention_dim, "grid": grid}
    scorer = LocalScore(**dims, base=local_base) if score == "local" else SCORES[score](**dims)
    where = None
    if position == "learned":
        if grid is None:
            raise ValueError("the learned 2-D position needs the grid (Hg, Wg)")
        where = GridPosition(grid=grid, annotation_dim=annotation_dim)
    shared = {"temperature": temperature, "position": where, "unit_annotations": unit_annotations}
    if kind == "hard":
        return HardAttention(scorer, **shared, expectation_prob=expectation_prob, coin=coin, warmup=warmup)
    return ATTENTION[kind](scorer, **shared)
