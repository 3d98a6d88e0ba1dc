"""Several processes, one model: DistributedDataParallel under `torchrun --nproc_per_node N train.py ...`.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them this is one process and every helper
here is a no-op. Each process takes its slice of every *global* batch (see data.sampling), DDP
averages the gradients, and rank 0 alone logs and writes checkpoints.

Matching one process exactly: every term of the loss is a sum over the captions of the global batch
divided by its real words, so each rank weights its local terms by its share of the global word
count; averaged over ranks that is the single-process loss, whatever the split of caption lengths
between ranks.

Never waiting on one another: a collective waits for every process, so the processes must take the
same path. Whatever one process alone can see (a stop signal, a loss that is not finite, a slice
with no readable image) is summed across processes in one small all-reduce per step (`agree`)
before anyone acts on it; long work is split between the processes (validation) or refused before
the group waits on it (a missing feature cache). A collective that still waits longer than
`train.dist_timeout` fails with a DistributedError naming what every process was doing.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from captioning.runtime.signals import STOP_SIGNALS


class DistributedError(RuntimeError):
    """The processes of a run could not go on together (a collective timed out, a process died)."""


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    timeout: float = 0.0  # seconds a collective may wait (train.dist_timeout)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def shard(self, count: int) -> tuple[int, int]:
        """This process's contiguous part [start, stop) of `count` items (near-equal parts, in rank order)."""
        return count * self.rank // self.world_size, count * (self.rank + 1) // self.world_size


ONE_PROCESS = Distributed()


def setup(device: torch.device, *, timeout: float) -> tuple[Distributed, torch.device]:
    """Join the process group that torchrun describes (NCCL on CUDA, gloo on CPU), collectives
    waiting at most `timeout` seconds; each process takes GPU LOCAL_RANK. Returns the context and the
    device this process works on."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed(timeout=timeout), device
    context = Distributed(rank=int(os.environ["RANK"]), world_size=world_size,
                          local_rank=int(os.environ.get("LOCAL_RANK", "0")), timeout=timeout)
    if device.type == "cuda":
        device = torch.device("cuda", context.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout))
    # What the processes tell one another (the step's agreement, validation's captions, the metric)
    # goes over gloo, on the CPU, even where the gradients go over NCCL: a gloo collective that waits
    # too long raises in Python, where `collective` names what each process was doing, while NCCL's
    # watchdog would end the process with its own message.
    _control["group"] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    return context, device


def teardown(context: Distributed) -> None:
    if context.enabled and dist.is_initialized():
        dist.destroy_process_group()  # and the control group with it
    _control["group"] = None


_control: dict[str, Any] = {"group": None}  # the gloo group for the processes' messages (setup)


# What each process is doing, for the message of a collective that waited too long ------------------

_doing = {"what": "starting"}


def _store() -> Any:
    """The group's key-value store (torchrun's agent serves it): reachable while collectives are stuck."""
    return dist.distributed_c10d._get_default_store()


def now_doing(context: Distributed, what: str) -> None:
    """Say what this process does from now on ("training, step 12", "validating at step 40"). The
    other processes read it from the group's store only when a collective fails."""
    _doing["what"] = what
    if context.enabled and dist.is_initialized():
        _store().set(f"captioning/doing/{context.rank}", what)


def _what_everyone_did(context: Distributed) -> str:
    parts = []
    for rank in range(context.world_size):
        key = f"captioning/doing/{rank}"
        try:
            what = _store().get(key).decode() if _store().check([key]) else "not started"
        except Exception:  # noqa: BLE001 - the store may be gone with the process that served it
            what = "unknown"
        parts.append(f"rank {rank}: {what}")
    return "; ".join(parts)


@contextmanager
def collective(context: Distributed, name: str) -> Iterator[None]:
    """Run one collective; if it fails (another process is still busy after train.dist_timeout, or
    died), raise one DistributedError naming what every process was doing."""
    try:
        yield
    except (RuntimeError, dist.DistError) as error:
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else error.__class__.__name__
        raise DistributedError(
            f"rank {context.rank} ({_doing['what']}): {name} did not complete within train.dist_timeout "
            f"({context.timeout:.0f} s) or a process is gone. What each process was doing: "
            f"{_what_everyone_did(context)}. ({first})") from error


def barrier(context: Distributed, *, name: str = "barrier") -> None:
    if context.enabled:
        with collective(context, name):
            dist.barrier(group=_control["group"])


# One small all-reduce per step: what every process must know before it acts --------------------------

@dataclass(frozen=True)
class Agreement:
    """What the processes agreed on in one step.

    share: the weight that turns this process's terms (sums over its captions divided by its real
    words) into its part of the global batch's once DDP averages the gradients: its share of the
    global batch's words times the number of processes (1.0 for one process; 0.0 for a process with
    no readable image in its slice). finite: every process's loss was finite. empty: no process had
    an image. signal: a stop signal that any process received (SIGTERM before SIGINT), or None."""

    share: float = 1.0
    finite: bool = True
    empty: bool = False
    signal: int | None = None
    unreadable: int = 0  # pairs of the global batch whose image could not be read
    named: int = 0  # of those, images that some process met for the first time (all_gathered next)


def agree(context: Distributed, *, words: float, images: float, loss: torch.Tensor | None,
          received: int | None, unreadable: int = 0, named: int = 0) -> Agreement:
    """Sum across processes, in one all-reduce: the words and images of each slice, whether each
    loss is finite, which stop signals arrived, and how many of each part's images could not be
    read (`named`: met for the first time). `loss` None: this process has nothing (it ran the step
    on a stand-in batch so that DDP's gradient all-reduce still matches)."""
    if not context.enabled:  # the step itself checks its own loss, in the trip that brings it to the host
        return Agreement(signal=received, unreadable=unreadable, named=named)
    not_finite = 0.0 if loss is None else float(~torch.isfinite(loss.detach()))  # the step's one sync
    flags = [float(received == s) for s in STOP_SIGNALS]
    total = torch.tensor([words, images, *flags, not_finite, unreadable, named],
                         dtype=torch.float64)  # [7], on the CPU (gloo)
    with collective(context, "the step's all-reduce"):
        dist.all_reduce(total, group=_control["group"])
    words_total, images_total, *signals, bad, unreadable_total, named_total = total.tolist()
    share = words * context.world_size / words_total if words_total else 0.0
    stop = next((int(s) for s, count in zip(STOP_SIGNALS, signals) if count), None)
    return Agreement(share=share, finite=bad == 0, empty=images_total == 0, signal=stop,
                     unreadable=int(unreadable_total), named=int(named_total))


def agree_signal(context: Distributed, received: int | None) -> int | None:
    """A stop signal that any process received (outside steps: after a validation)."""
    if not context.enabled:
        return received
    return agree(context, words=0.0, images=0.0, loss=None, received=received).signal


def sync_batch_norm(module: torch.nn.Module, context: Distributed, *, device: torch.device) -> torch.nn.Module:
    """Batch norm over the global batch (SyncBatchNorm) where fine-tuned stages train under DDP on GPUs;
    `module` unchanged otherwise (SyncBatchNorm has no CPU kernels, and frozen stages use running
    statistics anyway). The parameters stay the same objects: an optimizer built before still holds them.

    timm's conversion, not torch's: an EfficientNet's norms are timm's BatchNormAct2d, batch norm and
    its activation in one module, which torch's would make a plain SyncBatchNorm that never calls the
    activation (every ReLU6 gone); plain BatchNorm2d (VGG, ResNet) converts as torch's would."""
    if not (context.enabled and device.type == "cuda" and getattr(module, "trainable", True)):
        return module
    from timm.layers import convert_sync_batchnorm

    return convert_sync_batchnorm(module)


def broadcast_float(context: Distributed, value: float) -> float:
    """Rank 0's value on every rank (e.g. the validation metric that steps every rank's scheduler)."""
    if not context.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    with collective(context, "broadcast"):
        dist.broadcast(tensor, src=0, group=_control["group"])
    return float(tensor.item())


def gather(context: Distributed, value: Any) -> list[Any] | None:
    """Every process's `value` (picklable), in rank order, on rank 0; None on the others."""
    if not context.enabled:
        return [value]
    parts: list[Any] = [None] * context.world_size if context.is_main else None
    with collective(context, "gather"):
        dist.gather_object(value, parts, dst=0, group=_control["group"])
    return parts


def everyone(context: Distributed, value: Any) -> list[Any]:
    """Every process's `value` (picklable), in rank order, on every process."""
    if not context.enabled:
        return [value]
    parts: list[Any] = [None] * context.world_size
    with collective(context, "all-gather"):
        dist.all_gather_object(parts, value, group=_control["group"])
    return parts


def summed(context: Distributed, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over the processes (itself for one)."""
    if not context.enabled:
        return tensor
    total = tensor.clone()
    with collective(context, "all-reduce"):
        dist.all_reduce(total)
    return total


def wrapped(module: torch.nn.Module, context: Distributed, device: torch.device) -> torch.nn.Module:
    """The module DistributedDataParallel wraps under torchrun; the module itself in one process."""
    if not context.enabled:
        return module
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None)
