"""Attention over the annotation grid: a *score* function and a way of *using* the weights.

Notation: B batch, L grid cells (Hg x Wg), D annotation channels, H decoder hidden size, A attention size.

The score (captioning.model.scores) says how well each cell a_i matches the decoder state,
e_ti = score(h_{t-1}, a_i) (Eq. 4); alpha_t = softmax(e_t / tau) (Eq. 5, tau a temperature, 1 in
the paper). Soft attention takes the expectation of the annotations under alpha (Sec. 4.2); hard
attention samples one cell s_t ~ Categorical(alpha_t) and uses a_{s_t} (Sec. 4.1). Both return
the same AttentionOutput, so the decoder never asks which kind it holds, and every score works
with both.

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

from captioning.model.scores import SCORES, LocalScore, check_cells


@dataclass
class Memory:
    """What attention needs of one batch of images, computed once per image."""

    annotations: torch.Tensor  # [B, L, D], with the 2-D position added where configured
    keys: torch.Tensor | None  # the score's image-side work, e.g. [B, L, A]; None for `location`
    # Hard attention while training: True where this image uses the soft expectation instead of a
    # sample for its whole caption (Sec. 4.1: "with probability 0.5"). None otherwise.
    expectation: torch.Tensor | None = None  # [B] bool
    glimpse: Memory | None = None  # the decoder's second glimpse's own memory (model.glimpses=2)

    def select(self, index: torch.Tensor) -> Memory:
        """Rows of the batch, e.g. each image repeated once per beam."""

        def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.index_select(0, index)

        return Memory(pick(self.annotations), pick(self.keys), pick(self.expectation),
                      None if self.glimpse is None else self.glimpse.select(index))

    def prefix(self, rows: int) -> Memory:
        """The first `rows` images, as views (no copy): the rows still running when sorted by length."""

        def first(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[:rows]

        return Memory(first(self.annotations), first(self.keys), first(self.expectation),
                      None if self.glimpse is None else self.glimpse.prefix(rows))


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
        check_cells(annotations, position.shape[0], "2-D position of the")
        return annotations + position  # [B, L, D]


class GridCoordinates(nn.Module):
    """Two channels appended to every annotation: the centre (x, y) of its cell, in [-1, 1].

    Unlike a position *added* to the features (GridPosition), the coordinates stay separable from
    the content and average as coordinates do: under soft attention the context's last two channels
    are exactly the centre of mass of the map, sum_i alpha_ti (x_i, y_i), and under hard attention
    the chosen cell's centre. The decoder thus knows *where* it looked at every word, which a
    relation ("to the left of") needs and which translation-equivariant CNN features barely carry.
    They are scaled by each image's root-mean-square annotation channel (not learned, not a batch
    statistic), so they are as loud as an average channel whatever the backbone.
    An option (model.position=coordinates), off by default; the annotations become D + 2 wide.
    """

    channels = 2

    def __init__(self, *, grid: tuple[int, int]):
        super().__init__()
        rows, columns = grid
        y = (torch.arange(rows) + 0.5) / rows * 2 - 1  # [Hg], cell centres in [-1, 1]
        x = (torch.arange(columns) + 0.5) / columns * 2 - 1  # [Wg]
        grid_y, grid_x = torch.meshgrid(y, x, indexing="ij")
        self.register_buffer("centres", torch.stack([grid_x, grid_y], dim=2).flatten(0, 1), persistent=False)  # [L, 2]

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        check_cells(annotations, self.centres.shape[0], "2-D coordinates of the")
        scale = annotations.pow(2).mean(dim=(1, 2)).sqrt()  # [B], the image's RMS channel
        centres = self.centres.to(annotations.dtype)[None] * scale[:, None, None]  # [B, L, 2]
        return torch.cat([annotations, centres], dim=2)  # [B, L, D + 2]


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
        # Channels the position appends to each annotation: the context z_t is D + extra wide.
        self.extra_channels = getattr(position, "channels", 0)

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
                 inference: str = "expectation", warmup: int = 0, group: int = 1):
        super().__init__(score, temperature=temperature, position=position, unit_annotations=unit_annotations)
        if not 0.0 <= expectation_prob <= 1.0:
            raise ValueError(f"expectation_prob must lie in [0, 1], got {expectation_prob}")
        if coin not in self.COINS:
            raise ValueError(f"unknown coin '{coin}' (known: {', '.join(self.COINS)})")
        if inference not in self.CHOICES:
            raise ValueError(f"unknown hard attention choice '{inference}' (known: {', '.join(self.CHOICES)})")
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0 batches, got {warmup}")
        if group < 1:
            raise ValueError(f"group must be >= 1 rows per image, got {group}")
        self.expectation_prob = expectation_prob
        self.coin = coin
        self.inference = inference
        self.warmup = warmup
        # Rows per image: with train.samples = K, the K copies of a caption sit in consecutive rows
        # (train_step; the decoder's length sort is stable) and, being one image, share one coin.
        self.group = group
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
            if batch % self.group:
                raise ValueError(f"a batch of {batch} rows is not whole images of {self.group} rows each")
            images = 1 if self.coin == "batch" else batch // self.group
            draws = torch.rand(images, device=device).repeat_interleave(batch // images)  # [B], Sec. 4.1
            memory.expectation = draws < self.current_expectation_prob()  # [B]
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


ATTENTION: dict[str, type[_Attention]] = {"soft": SoftAttention, "hard": HardAttention}
POSITIONS = ("none", "learned", "coordinates")


def build_attention(*, kind: str = "soft", score: str = "additive", annotation_dim: int, hidden_dim: int,
                    attention_dim: int, grid: tuple[int, int] | None = None, temperature: float = 1.0,
                    position: str = "none", local_base: str = "additive", local_window: str = "gaussian",
                    local_sigma: float | None = None, cosine_sharpness: float | None = None,
                    unit_annotations: bool = False,
                    expectation_prob: float = 0.5, coin: str = "image", warmup: int = 0,
                    group: int = 1) -> _Attention:
    """Any score with either kind. `grid` is needed by the location and local scores and the 2-D
    position; `expectation_prob`, `coin` and `group` concern hard attention only."""
    if score not in SCORES:
        raise ValueError(f"unknown attention score '{score}' (known: {', '.join(SCORES)})")
    if kind not in ATTENTION:
        raise ValueError(f"unknown attention kind '{kind}' (known: {', '.join(ATTENTION)})")
    if position not in POSITIONS:
        raise ValueError(f"unknown attention position '{position}' (known: {', '.join(POSITIONS)})")
    where = None
    if position != "none" and grid is None:
        raise ValueError(f"the {position} 2-D position needs the grid (Hg, Wg)")
    if position == "learned":
        where = GridPosition(grid=grid, annotation_dim=annotation_dim)
    elif position == "coordinates":
        where = GridCoordinates(grid=grid)
    # The score sees the annotations as the position left them (D + 2 wide with coordinates).
    dims = {"annotation_dim": annotation_dim + getattr(where, "channels", 0), "hidden_dim": hidden_dim,
            "attention_dim": attention_dim, "grid": grid}
    if score != "local" and local_window != "gaussian":
        raise ValueError(f"the '{local_window}' local window applies to the local score only, not '{score}'")
    if score != "local" and local_sigma is not None:
        raise ValueError(f"the local window's width applies to the local score only, not '{score}'")
    cosine = score == "cosine" or (score == "local" and local_base == "cosine")
    if not cosine and cosine_sharpness is not None:
        raise ValueError(f"the sharpness applies to the cosine score only (or the local score on a cosine base), "
                         f"not '{score}'" + (f" on '{local_base}'" if score == "local" else ""))
    sharpness = {"sharpness": cosine_sharpness} if cosine_sharpness is not None else {}
    if score == "local":
        scorer = LocalScore(**dims, base=local_base, window=local_window, sigma=local_sigma, base_options=sharpness)
    else:
        scorer = SCORES[score](**dims, **sharpness)
    shared = {"temperature": temperature, "position": where, "unit_annotations": unit_annotations}
    if kind == "hard":
        return HardAttention(scorer, **shared, expectation_prob=expectation_prob, coin=coin, warmup=warmup,
                             group=group)
    return ATTENTION[kind](scorer, **shared)
