"""Several processes, one model: DistributedDataParallel under `torchrun --nproc_per_node N train.py ...`.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them this is one process and every helper
here is a no-op. Each process takes its slice of every *global* batch (see data.sampling), DDP
averages the gradients, and rank 0 alone evaluates, logs and writes checkpoints.

Matching one process exactly: the loss is a mean over the real words of the global batch (and the
doubly stochastic term a mean over its images), so each rank weights its local mean by its share
of the global count; averaged over ranks that is the single-process loss, whatever the split of
caption lengths between ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: torch.device) -> tuple[Distributed, torch.device]:
    """Join the process group that torchrun describes (NCCL on CUDA, gloo on CPU); each process
    takes GPU LOCAL_RANK. Returns the context and the device this process works on."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed(), device
    context = Distributed(rank=int(os.environ["RANK"]), world_size=world_size,
                          local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        device = torch.device("cuda", context.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return context, device


def teardown(context: Distributed) -> None:
    if context.enabled and dist.is_initialized():
        dist.destroy_process_group()


def barrier(context: Distributed) -> None:
    if context.enabled:
        dist.barrier()


def global_shares(context: Distributed, *counts: float, device: torch.device) -> list[float]:
    """For each local count n_r: n_r * world_size / sum_r n_r, the weight that turns this rank's local
    mean into its part of the global mean once DDP averages the gradients (1.0 for one process)."""
    if not context.enabled:
        return [1.0] * len(counts)
    local = torch.tensor(counts, dtype=torch.float64, device=device)
    total = local.clone()
    dist.all_reduce(total)
    return (local * context.world_size / total).tolist()


def broadcast_float(context: Distributed, value: float, *, device: torch.device) -> float:
    """Rank 0's value on every rank (e.g. the validation metric that steps every rank's scheduler)."""
    if not context.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return float(tensor.item())
