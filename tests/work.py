"""Counting the work a computation does: its floating-point operations, as torch.utils.flop_counter
counts them (matrix products, convolutions and attention kernels; elementwise work is not counted).

    flops(decoder.start, annotations)  # how many, for this call

Tests hold costs to what the algorithm implies (work done once per image, not per beam or step)
without naming the modules or functions that do it."""

from __future__ import annotations

from torch.utils.flop_counter import FlopCounterMode


def flops(run, *args, **kwargs) -> int:
    """The floating-point operations of `run(*args, **kwargs)`."""
    with FlopCounterMode(display=False) as counter:
        run(*args, **kwargs)
    return counter.get_total_flops()
