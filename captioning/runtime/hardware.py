"""Where a run computes, decided in one place: its device, its process among several, its precision;
and its numbers brought back to the host in one trip (`floats`).

Under torchrun (WORLD_SIZE > 1) each process joins the group and takes GPU LOCAL_RANK
(captioning.runtime.distributed); precision is bf16 autocast where the device computes it natively,
fp16 with a gradient scaler otherwise, or float32 without train.amp (captioning.runtime.precision).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from captioning.runtime import distributed
from captioning.runtime.precision import Precision, allow_tf32, precision_for


class DeviceError(ValueError):
    """A device asked for that is not one, or not on this machine: one line, before any work."""


def default_device(name: str | None = None) -> torch.device:
    """`name` (cpu, cuda, cuda:1 ...), or the GPU if there is one."""
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"device {name!r}: not a device (cpu, cuda, cuda:1 ...)") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise DeviceError(f"device {name!r}: no CUDA GPU here (torch.cuda.is_available() is False)")
    if device.index is not None and device.index >= (count := torch.cuda.device_count()):
        raise DeviceError(f"device {name!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    return device


@dataclass(frozen=True)
class Hardware:
    context: distributed.Distributed  # this process's rank among world_size
    device: torch.device
    precision: Precision

    @classmethod
    def setup(cls, device: str | torch.device, *, amp: bool, tf32: bool = True, timeout: float = 1800.0) -> Hardware:
        """Join the process group torchrun describes (a no-op for one process), its collectives
        waiting at most `timeout` seconds, and pick the precision."""
        context, device = distributed.setup(torch.device(device), timeout=timeout)
        allow_tf32(tf32)
        return cls(context, device, precision_for(device, amp=amp))

    def teardown(self) -> None:
        distributed.teardown(self.context)

    @property
    def pin_memory(self) -> bool:
        return self.device.type == "cuda"


# bringing numbers to the host ---------------------------------------------------------------------
# Bringing a step's numbers to the host in one trip.
#
# On a GPU, each `.item()` makes the host wait until the device has done all the work queued before
# it, and the host cannot queue the next kernels meanwhile. A training step's statistics are read
# together instead: one stack, one `.tolist()` (tests/train/test_syncs.py counts the trips).

def floats(*scalars: torch.Tensor) -> list[float]:
    """The values of 0-dim tensors, as `.item()` gives each of them, in one trip to the host. They
    are stacked in the widest of their dtypes, so no value is rounded on the way."""
    dtype = functools.reduce(torch.promote_types, (s.dtype for s in scalars))
    return torch.stack([s.detach().to(dtype) for s in scalars]).tolist()
