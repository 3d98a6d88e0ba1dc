"""Bringing a step's numbers to the host in one trip.

On a GPU, each `.item()` makes the host wait until the device has done all the work queued before
it, and the host cannot queue the next kernels meanwhile. A training step's statistics are read
together instead: one stack, one `.tolist()` (tests/train/test_syncs.py counts the trips).
"""

from __future__ import annotations

import functools

import torch


def floats(*scalars: torch.Tensor) -> list[float]:
    """The values of 0-dim tensors, as `.item()` gives each of them, in one trip to the host. They
    are stacked in the widest of their dtypes, so no value is rounded on the way."""
    dtype = functools.reduce(torch.promote_types, (s.dtype for s in scalars))
    return torch.stack([s.detach().to(dtype) for s in scalars]).tolist()
