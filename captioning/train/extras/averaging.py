"""An average of the decoder's weights (train.ema_decay; not in the paper).

An exponential moving average of the weights (Polyak and Juditsky, 1992), updated after every
optimizer step, is the model that is validated, kept as best.pt and used to caption. A greedy
validation metric moves from epoch to epoch, so the best checkpoint is one draw from that noise; the
average is a smoother model to pick from. It never enters a gradient step: training goes on from its
own weights, which checkpoints keep beside the average ("training_decoder").
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


class WeightAverage:
    """After each step the average moves 1 - decay of the way to the decoder's new weights."""

    def __init__(self, decoder: nn.Module, *, decay: float):
        self.averaged = AveragedModel(decoder, multi_avg_fn=get_ema_multi_avg_fn(decay))

    @property
    def module(self) -> nn.Module:
        """The averaged decoder: a decoder like the trained one, with a plain decoder's state dict."""
        return self.averaged.module

    def update(self, decoder: nn.Module) -> None:
        self.averaged.update_parameters(decoder)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a saved average (not restart it from the trained weights, as n_averaged = 0 would)."""
        self.averaged.module.load_state_dict(state)
        self.averaged.n_averaged.fill_(1)
