"""Counting host syncs: calls that make the host wait for a value computed on the device.

On a GPU, every `.item()`, `bool(tensor)` (an `if` on a tensor), `.tolist()`, boolean mask or
`nonzero` stops the CPU until the GPU has caught up, so the CPU can no longer queue the next
kernels ahead. Tests run on the CPU, where nothing waits, so they count the *calls* instead: the
same Python code makes the same calls on either device. `counting_syncs()` is a TorchFunctionMode,
which sees every torch function and Tensor method called from Python:

    with counting_syncs() as syncs:
        train_step(...)
    syncs.total, syncs.counts["item"], syncs.sites  # how many, by kind, and from which line

What it cannot see: calls made inside C++ (a tensor given where a number is expected, e.g.
`torch.full(size, tensor)`, reads it on the host unseen), and blocking host-to-device copies
(`torch.tensor(list, device=cuda)`, `.to(cuda)` of a host tensor), which look like any other `.to`
on a CPU. Code under test should not rely on those; `torch.cuda.set_sync_debug_mode("warn")` is the
check on a GPU.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

# Methods and functions that always hand a value to the host, by the name they are counted under.
ALWAYS = {
    "item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__complex__",
    "__array__", "__format__", "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
    "bincount", "_unique", "_unique2",
}
TORCH = str(Path(torch.__file__).parent)


def _name(func) -> str:
    if func is torch.unique or func is torch.Tensor.unique:  # a Python wrapper whose __name__ is "fn"
        return "unique"
    return getattr(func, "__name__", None) or repr(func)


def _bool_index(key) -> bool:
    """Whether an index holds a boolean tensor (a mask: its result's size needs the mask's count)."""
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, torch.Tensor) and k.dtype == torch.bool and k.dim() > 0 for k in keys)


def _to_host(args, kwargs) -> bool:
    """Whether a `.to(...)` call names the CPU as its target in so many words: `.to("cpu")`. A
    torch.device usually comes from another tensor (`.to(x.device)`), which on a test's CPU is the
    CPU too without being a move to the host on a GPU."""
    return any(isinstance(value, str) and torch.device(value).type == "cpu"
               for value in (*args[1:], kwargs.get("device")))


def _kind(func, args, kwargs) -> str | None:
    """The name a call is counted under, or None if it leaves the value on the device."""
    name = _name(func)
    if name in ALWAYS:
        return name
    if name in ("__getitem__", "__setitem__") and len(args) > 1 and _bool_index(args[1]):
        return f"{name}[mask]"  # x[mask]: the result's size is the number of True
    if name in ("index_put", "index_put_") and len(args) > 1 and _bool_index(tuple(args[1])):
        return f"{name}[mask]"
    if name == "where" and len(args) + len(kwargs) == 1:
        return "where(condition)"  # the one-argument form is nonzero
    if name == "repeat_interleave" and len(args) > 1 and isinstance(args[1], torch.Tensor) \
            and args[1].numel() > 1 and kwargs.get("output_size") is None:
        return "repeat_interleave(tensor)"  # the output's size is the sum of the repeats
    if name == "to" and _to_host(args, kwargs):
        return "to(cpu)"
    return None


def _caller() -> str:
    """file:line of the innermost frame outside torch and this file: the line that asked."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(TORCH) or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


@dataclass
class Syncs:
    counts: Counter[str] = field(default_factory=Counter)  # by kind: "item", "__bool__", ...
    sites: Counter[tuple[str, str]] = field(default_factory=Counter)  # by (kind, "file.py:line")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class _Counting(TorchFunctionMode):
    def __init__(self, syncs: Syncs):
        super().__init__()
        self.syncs = syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _kind(func, args, kwargs)
        if kind is not None:
            self.syncs.counts[kind] += 1
            self.syncs.sites[kind, _caller()] += 1
        return func(*args, **kwargs)


@contextmanager
def counting_syncs() -> Iterator[Syncs]:
    """Within the block, count the calls that move a value to the host (see the module docstring)."""
    syncs = Syncs()
    with _Counting(syncs):
        yield syncs
