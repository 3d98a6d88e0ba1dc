"""CUDA graphs on the CPU: stand-ins for torch.cuda's CUDAGraph, graph(), streams and memory pools,
so that code which captures and replays a graph runs in the CPU suite.

What CUDA does, and what the stand-in does in its place:

- **Capturing records the kernels and runs none of them.** A tensor that existed before the capture
  keeps its values, and a tensor the captured block allocates holds whatever its memory held. The
  stand-in runs each aten op to learn its results and records it. When the block ends, it puts back
  every tensor the block wrote that existed before, and it fills each tensor the block allocated with
  NaN (integers with -1, booleans with True). A result read before any replay is then visibly wrong.
- **Replaying runs the recorded kernels again on the same memory.** New values copied into the
  captured inputs flow through, and the results land where the capture put them. The stand-in calls
  each recorded op again on the same tensors and copies each fresh result into the tensor that the
  capture returned.
- **Python runs once, at capture.** A number read in Python then, a learning rate for example, is
  baked into the graph. Only aten ops are replayed here, so the same holds.
- **Reading a value on the host inside a capture is an error** (cudaErrorStreamCaptureUnsupported),
  and so it is here. So is an optimizer's step whose param_groups are not `capturable`, as torch's
  own check raises on a GPU (its step count must live on the device); and a capturable optimizer
  stepped outside a capture warns, as torch's check does there.

It also refuses what torch refuses of a capture's arguments: an error mode torch does not know, and
a stream that is not one. What it does not model: the memory pool (each graph records the pool it
was captured into, but graphs that share one do not reuse each other's freed memory here), streams
(work is ordered here anyway), and random numbers (a replay draws afresh, as CUDA's Philox offsets
do).

    graphs = cpu_cuda_graphs(monkeypatch)   # torch.cuda's graph API, on the CPU, for this test
    ...                                     # the code under test captures and replays
    graphs.captured, graphs.replays         # the graphs made, and how often each replayed
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")  # what torch.cuda.graph accepts

# Ops whose result the host must read, so CUDA refuses them while a stream captures.
HOST_READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default}


def _writes(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an op writes in place: the arguments its schema marks `(a!)`."""
    written = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        written += [tensor for tensor in tree_flatten(value)[0] if isinstance(tensor, torch.Tensor)]
    return written


def _fresh(func, results) -> list[torch.Tensor]:
    """The tensors an op allocated: its results that its schema does not declare an alias of an input."""
    fresh = []
    for returned, value in zip(func._schema.returns, results if isinstance(results, tuple) else (results,)):
        if returned.alias_info is None:
            fresh += [tensor for tensor in tree_flatten(value)[0] if isinstance(tensor, torch.Tensor)]
    return fresh


def _garbage(tensor: torch.Tensor) -> None:
    """What an unwritten block of the pool may hold: values no computation gives."""
    if tensor.dtype == torch.bool:
        tensor.fill_(True)
    elif tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(math.nan)
    else:
        tensor.fill_(-1)


@dataclass
class _Op:
    func: object
    args: tuple
    kwargs: dict
    fresh: list[torch.Tensor]  # what the capture's run allocated: where a replay writes its results


class _Recording(TorchDispatchMode):
    """Records each op the captured block runs, and what it wrote that existed before the block."""

    def __init__(self, graph: CPUGraph):
        super().__init__()
        self.graph = graph
        self.allocated: set[int] = set()  # storages the block allocated (their data pointers)
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tensor, its values before the block)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise RuntimeError(f"{func} reads a value on the host, which a stream being captured refuses")
        for tensor in _writes(func, args, kwargs):
            if tensor.untyped_storage().data_ptr() not in self.allocated:
                self.saved.append((tensor, tensor.clone()))
        results = func(*args, **kwargs)
        if func.namespace == "profiler":  # the optimizer's record_function marks: no kernel
            return results
        fresh = _fresh(func, results)
        self.allocated.update(tensor.untyped_storage().data_ptr() for tensor in fresh)
        self.graph.ops.append(_Op(func, args, kwargs, fresh))
        return results


class CPUGraph:
    """torch.cuda.CUDAGraph's part that code uses: filled by `graph(...)`, then `replay()`."""

    def __init__(self, graphs: CPUGraphs):
        self.ops: list[_Op] = []
        self.replays = 0
        self.pool = None  # the memory pool it was captured into: graph_pool_handle()'s, or None for its own
        graphs.captured.append(self)

    def replay(self) -> None:
        if not self.ops:
            raise RuntimeError("replay of a graph that captured nothing")
        self.replays += 1
        with torch.no_grad():  # kernels: what autograd recorded at capture is already among them
            for op in self.ops:
                results = op.func(*op.args, **op.kwargs)
                for target, value in zip(op.fresh, _fresh(op.func, results)):
                    target.copy_(value)


@dataclass
class CPUGraphs:
    """The stand-in API, and what was done with it."""

    captured: list[CPUGraph] = field(default_factory=list)
    pools: int = 0  # graph_pool_handle() calls
    capturing: bool = False

    @property
    def replays(self) -> list[int]:
        return [graph.replays for graph in self.captured]

    def CUDAGraph(self) -> CPUGraph:  # noqa: N802 (torch.cuda's name)
        return CPUGraph(self)

    @contextlib.contextmanager
    def graph(self, cuda_graph: CPUGraph, pool=None, stream=None, capture_error_mode="global"):
        if cuda_graph.ops:
            raise RuntimeError("a graph is captured once")
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise RuntimeError(f"capture_error_mode {capture_error_mode!r} is none of {CAPTURE_ERROR_MODES}")
        cuda_graph.pool = pool
        recording = _Recording(cuda_graph)
        self.capturing = True
        try:
            with recording:
                yield
        finally:
            self.capturing = False
        with torch.no_grad():
            for tensor, before in reversed(recording.saved):  # the first snapshot of each is put back last
                tensor.copy_(before)
            for op in cuda_graph.ops:
                for tensor in op.fresh:
                    _garbage(tensor)

    def optimizer_check(self, optimizer: torch.optim.Optimizer) -> None:
        """torch's check of an optimizer stepped while a stream captures (on a GPU it runs there alone)."""
        capturable = all(group["capturable"] for group in optimizer.param_groups)
        if self.capturing and not capturable:
            raise RuntimeError(f"graph capture of step() for {type(optimizer).__name__} with capturable False")
        if capturable and not self.capturing:
            warnings.warn(f"{type(optimizer).__name__} with capturable=True stepped outside a graph capture",
                          stacklevel=2)

    def graph_pool_handle(self) -> tuple[int, int]:
        self.pools += 1
        return (0, self.pools)


class _Stream:
    def wait_stream(self, other: _Stream) -> None:
        if not isinstance(other, _Stream):  # torch's records an event on `other`
            raise AttributeError(f"wait_stream({other!r}): not a stream")


def cpu_cuda_graphs(monkeypatch) -> CPUGraphs:
    """Put the stand-ins in torch.cuda for the rest of the test (pytest's monkeypatch puts them back)."""
    graphs = CPUGraphs()
    for name in ("CUDAGraph", "graph", "graph_pool_handle"):
        monkeypatch.setattr(torch.cuda, name, getattr(graphs, name))
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    stream = _Stream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *device: stream)
    monkeypatch.setattr(torch.optim.Optimizer, "_accelerator_graph_capture_health_check",
                        lambda optimizer: graphs.optimizer_check(optimizer))  # a function: bound to each optimizer
    return graphs
