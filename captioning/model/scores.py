"""Attention scores: how well each annotation a_i matches the decoder state, e_ti = score(h_{t-1}, a_i).

Notation: B batch, L grid cells (Hg x Wg), D annotation channels, H decoder hidden size, A attention size.

Eq. 4 of the paper uses an MLP, Bahdanau's additive score (captioning.model.paper.AdditiveScore);
this module holds the rest of the family, each in its place. How the weights alpha_t = softmax(e_t)
are *used*, soft or hard, is the paper's attention's business: any score works with either.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from captioning.config import Config, ModelConfig
from captioning.config.registry import LOCAL_WINDOWS, SCORES

# Scores ------------------------------------------------------------------------------------------
#
# Every score registers under its model.score name (captioning.config.registry), takes the same
# keyword arguments (so that SCORES can build any of them alike) and has
#   keys(annotations [B, L, D]) -> keys, the image-only work, once per image;
#   forward(keys, hidden [B, H]) -> e [B, L], once per step.
# `grid` (Hg, Wg) is needed only by the scores that know where cells are (location, local). A score
# with settings of its own registers their dataclass (`settings=`: the section model.<its name>),
# reads them in `options` and checks them in `problems` (captioning.config.checks asks the chosen
# score).


class Score(nn.Module):
    """What every score shares: how a config builds it."""

    def __init_subclass__(cls, **kwargs) -> None:
        # A score written before the image's work was named `keys` (it was `prepare`, which is also a
        # command) still works: its `prepare` answers as its keys, with a warning.
        super().__init_subclass__(**kwargs)
        if "prepare" in cls.__dict__ and "keys" not in cls.__dict__:
            warnings.warn(f"{cls.__qualname__}.prepare is now named keys (the old name still works)", FutureWarning,
                          stacklevel=2)
            cls.keys = cls.__dict__["prepare"]

    @classmethod
    def options(cls, model: ModelConfig) -> dict:
        """The keyword arguments this score takes from its own section of `model:` (none here)."""
        return {}

    @classmethod
    def from_config(cls, model: ModelConfig, *, annotation_dim: int, hidden_dim: int,
                    grid: tuple[int, int] | None) -> Score:
        return cls(annotation_dim=annotation_dim, hidden_dim=hidden_dim, attention_dim=model.attention_dim,
                   grid=grid, **cls.options(model))


def _query(hidden_dim: int, annotation_dim: int) -> nn.Module:
    """q = h when the sizes agree, else a learned projection W_q h (Luong's dot needs H == D)."""
    return nn.Identity() if hidden_dim == annotation_dim else nn.Linear(hidden_dim, annotation_dim, bias=False)


def check_cells(annotations: torch.Tensor, cells: int, name: str) -> None:
    if annotations.shape[1] != cells:
        raise ValueError(f"the {name} score was built for {cells} grid cells, got annotations with "
                         f"{annotations.shape[1]}")


@SCORES.register("concat")
class ConcatScore(Score):
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

    def keys(self, annotations: torch.Tensor) -> torch.Tensor:
        W_a = self.W.weight[:, self.hidden_dim:]  # [A, D], the annotation block of W
        return annotations @ W_a.T + self.W.bias  # [B, L, A], once per image

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = hidden @ self.W.weight[:, : self.hidden_dim].T  # [B, A], the hidden block of W
        return self.v(torch.tanh(keys + query[:, None, :])).squeeze(2)  # [B, L]


@SCORES.register("general")
class GeneralScore(Score):
    """Luong's general (bilinear) score: e_ti = h_{t-1}^T W a_i; W a_i runs once per image."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        self.W = nn.Linear(annotation_dim, hidden_dim, bias=False)  # W [H, D]

    def keys(self, annotations: torch.Tensor) -> torch.Tensor:
        return self.W(annotations)  # [B, L, H]

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.bmm(keys, hidden[:, :, None]).squeeze(2)  # [B, L]


@SCORES.register("dot")
class DotScore(Score):
    """Luong's dot score: e_ti = q^T a_i, q = h_{t-1} (or W_q h_{t-1} when H != D)."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        self.query = _query(hidden_dim, annotation_dim)
        self.scale = 1.0

    def keys(self, annotations: torch.Tensor) -> torch.Tensor:
        return annotations  # [B, L, D]: nothing to precompute, the keys are the annotations

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = self.query(hidden)  # [B, D]
        return torch.bmm(keys, query[:, :, None]).squeeze(2) * self.scale  # [B, L]


@SCORES.register("scaled_dot")
class ScaledDotScore(DotScore):
    """Vaswani et al.'s scaled dot product: e_ti = q^T a_i / sqrt(D), which keeps the softmax out of
    saturation when D is large."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__(annotation_dim=annotation_dim, hidden_dim=hidden_dim, attention_dim=attention_dim)
        self.scale = 1.0 / math.sqrt(annotation_dim)


@dataclass
class CosineConfig:
    """model.cosine: the cosine score's (and the local score's cosine base's) sharpness."""

    sharpness: float | None = None  # beta at the start, then learned (None: 5)


@SCORES.register("cosine", settings=CosineConfig)
class CosineScore(Score):
    """Graves' content-based score: e_ti = beta * cos(q, a_i), q = h_{t-1} (or W_q h_{t-1}).

    A cosine lies in [-1, 1], so over L = 196 cells its softmax is nearly flat; a sharpness
    beta > 0 (learned by default, through log beta) lets the map become peaked.
    """

    @classmethod
    def options(cls, model: ModelConfig) -> dict:
        sharpness = model.cosine.sharpness  # None: the default beta
        return {} if sharpness is None else {"sharpness": sharpness}

    @staticmethod
    def problems(config: Config) -> list[str]:
        """What the cosine score refuses of a config, chosen as model.score or as model.local.base."""
        sharpness = config.model.cosine.sharpness
        return [] if sharpness is None or sharpness > 0 else [f"model.cosine.sharpness must be positive, "
                                                               f"got {sharpness!r}"]

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None, sharpness: float = 5.0, learn_sharpness: bool = True):
        super().__init__()
        self.query = _query(hidden_dim, annotation_dim)
        log_sharpness = torch.tensor(math.log(sharpness))
        if learn_sharpness:
            self.log_sharpness = nn.Parameter(log_sharpness)
        else:
            self.register_buffer("log_sharpness", log_sharpness)

    def keys(self, annotations: torch.Tensor) -> torch.Tensor:
        return F.normalize(annotations, dim=2)  # [B, L, D], unit annotations, once per image

    def forward(self, keys: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        query = F.normalize(self.query(hidden), dim=1)  # [B, D]
        return self.log_sharpness.exp() * torch.bmm(keys, query[:, :, None]).squeeze(2)  # [B, L]


@SCORES.register("location")
class LocationScore(Score):
    """Luong's location-based score: e_t = W_loc h_{t-1} + b, one number per cell; the content of
    the cells is ignored, so it can only learn *where* captions tend to look at each step."""

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        if grid is None:
            raise ValueError("the location score needs the grid (Hg, Wg): it has one output per cell")
        self.cells = grid[0] * grid[1]
        self.W = nn.Linear(hidden_dim, self.cells)  # W_loc

    def keys(self, annotations: torch.Tensor) -> None:
        check_cells(annotations, self.cells, "location")
        return None  # nothing image-side: the score ignores the annotations

    def forward(self, keys: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
        return self.W(hidden)  # [B, L]


@dataclass
class LocalConfig:
    """model.local: the local score's window."""

    base: str = "additive"  # the content score under the window
    window: str = "gaussian"  # Luong's; "learned" adds a learned shape (model/extras/window.py)
    sigma: float | None = None  # the window's width in grid cells (None: a quarter of the grid's longer side)


@SCORES.register("local", settings=LocalConfig)
@LOCAL_WINDOWS.register("gaussian")
class LocalScore(Score):
    """Luong's local-p attention in 2-D: a base score plus the log of a Gaussian window.

      p_t  = (Hg, Wg) * sigmoid(W_p tanh(V_p h_{t-1}))        the predicted centre, in cell units
      e_ti = base(h_{t-1}, a_i) - ||c_i - p_t||^2 / (2 sigma^2)   c_i the centre of cell i

    so alpha_t ∝ softmax(base)_i * exp(-||c_i - p_t||^2 / 2 sigma^2): Luong's window multiplied into
    the weights, then renormalized, because alpha must stay a distribution (hard attention samples
    from it). sigma defaults to a quarter of the grid's longer side (3.5 cells at 14x14).
    model/extras/window.py adds a learned shape to the window (not in Luong or the paper).
    """

    @classmethod
    def options(cls, model: ModelConfig) -> dict:
        local = model.local  # the base score's own options too, e.g. a cosine base's sharpness
        return {"base": local.base, "sigma": local.sigma, "base_options": SCORES[local.base].options(model)}

    @classmethod
    def from_config(cls, model: ModelConfig, *, annotation_dim: int, hidden_dim: int,
                    grid: tuple[int, int] | None) -> Score:
        """The local score with the window model.local.window names (this Gaussian, or a subclass's)."""
        window = LOCAL_WINDOWS[model.local.window]
        return window(annotation_dim=annotation_dim, hidden_dim=hidden_dim, attention_dim=model.attention_dim,
                      grid=grid, **cls.options(model))

    @staticmethod
    def problems(config: Config) -> list[str]:
        """What the local score refuses of a config (captioning.config.checks asks the chosen score)."""
        local, problems = config.model.local, []
        if config.model.score == "local" and local.base == "local":
            problems.append(f"model.local.base '{local.base}' is not one of the scores a window can wrap (every "
                            "score but local)")
        if local.sigma is not None and local.sigma <= 0:
            problems.append(f"model.local.sigma must be positive, got {local.sigma!r}")
        return problems

    def __init__(self, *, annotation_dim: int, hidden_dim: int, attention_dim: int,
                 grid: tuple[int, int] | None = None, base: str = "additive", sigma: float | None = None,
                 base_options: dict | None = None):
        super().__init__()
        if grid is None:
            raise ValueError("the local score needs the grid (Hg, Wg): its window lives on the grid")
        self.base = SCORES[base](annotation_dim=annotation_dim, hidden_dim=hidden_dim, attention_dim=attention_dim,
                                 grid=grid, **(base_options or {}))  # e.g. the cosine base's sharpness
        self.centre = nn.Sequential(nn.Linear(hidden_dim, attention_dim), nn.Tanh(),  # V_p
                                    nn.Linear(attention_dim, 2))  # W_p: (row, column)
        rows, columns = torch.meshgrid(torch.arange(grid[0]) + 0.5, torch.arange(grid[1]) + 0.5, indexing="ij")
        # Fixed geometry, not weights: kept out of the state dict, but moved by .to(device/dtype).
        self.register_buffer("cells", torch.stack([rows, columns], dim=2).view(-1, 2), persistent=False)  # [L, 2]
        self.register_buffer("extent", torch.tensor([float(grid[0]), float(grid[1])]), persistent=False)  # [2]
        self.sigma = float(sigma) if sigma is not None else max(grid) / 4

    def keys(self, annotations: torch.Tensor) -> torch.Tensor | None:
        check_cells(annotations, self.cells.shape[0], "local")
        return self.base.keys(annotations)

    def centre_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """p_t [B, 2] in cell units: (row, column), each in (0, Hg) x (0, Wg)."""
        return self.extent * torch.sigmoid(self.centre(hidden))

    def offset(self, hidden: torch.Tensor) -> torch.Tensor:
        """c_i - p_t [B, L, 2], in cells."""
        return self.cells[None] - self.centre_of(hidden)[:, None]

    def window_scores(self, keys: torch.Tensor | None, hidden: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """The base score plus the log of the Gaussian window around p_t, [B, L]."""
        return self.base(keys, hidden) - (offset ** 2).sum(2) / (2 * self.sigma ** 2)

    def forward(self, keys: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
        return self.window_scores(keys, hidden, self.offset(hidden))  # [B, L]

