"""Around the paper's attention (captioning.model.paper): how a run shares its coins out among the rows
of a batch, and which cell hard attention picks when a model decodes.

Notation: B batch, T caption steps, L grid cells.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from captioning.config.checks import hard_choice_problem
from captioning.config.schema import ConfigError
from captioning.model.paper import HardAttention


def shared_coins(draws: torch.Tensor, *, group: int, coin: str) -> torch.Tensor:
    """`draws` [R, 1 + T] (Draws.from_uniform) with column 0 made the coin of each row's image:
    the rows come image by image, `group` rows each (an image's K samples of locations), and each
    takes its image's first row's draw; with `coin="batch"` (the authors' code) every row takes row
    0's, one coin for the whole batch. The one place where a run's coins are shared out."""
    rows = draws.shape[0]
    by_image = draws[::group, 0].repeat_interleave(group)[:rows]  # [R]
    coins = draws[:1, 0].expand(rows) if coin == "batch" else by_image  # [R]
    return torch.cat([coins[:, None], draws[:, 1:]], dim=1)


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
