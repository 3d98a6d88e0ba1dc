"""benchmarks/gpu/gpu.py's profile part: where the training step's time goes, before anything is made
faster. The package's soft fused step (speed.training_case's, bf16 autocast, the COCO configs'
decoder) is recorded by torch.profiler over its timed steps at each of plan.profile_batches, after
the warm-up; each row gives the step's time, its kernel launches and the bytes its kernels
allocate, per step, and its heaviest kernels by time. DIR/profile.md (beside gpu.md) keeps the
table of each batch size's ten heaviest kernels.

On the GPU a kernel is a CUDA kernel (its device time); on the smoke's CPU an operator (its CPU time).
Bytes are what the operator's outputs allocate (the profiler's memory record), not the bytes it
reads and writes: a kernel that only reads a large tensor shows few.

Notation: B batch.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from plan import Context, free_memory
from speed import grid_name, training_case

HEAVIEST = 10  # kernels kept per batch size


def kernel_table(profiler: torch.profiler.profile, *, device: torch.device, steps: int) -> list[dict]:
    """Each kernel (operator on a CPU) by its own time over the recorded steps, heaviest first, per step:
    name, milliseconds, share of the step's kernel time, launches and allocated bytes."""
    cuda = device.type == "cuda"
    events = [event for event in profiler.key_averages() if not event.key.startswith("ProfilerStep")
              and (event.self_device_time_total if cuda else event.self_cpu_time_total) > 0]
    if cuda:  # CUDA kernels only: the operators that launch them are counted in their kernels
        events = [event for event in events if event.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(event.self_device_time_total if cuda else event.self_cpu_time_total for event in events) or 1.0
    rows = []
    for event in events:
        micros = event.self_device_time_total if cuda else event.self_cpu_time_total
        allocated = event.self_device_memory_usage if cuda else event.self_cpu_memory_usage
        rows.append({"kernel": event.key[:90], "ms": micros / 1000 / steps, "share": micros / total,
                     "launches": event.count / steps, "bytes": max(allocated, 0) / steps})
    return sorted(rows, key=lambda row: -row["ms"])


def profile_case(context: Context, *, batch: int, out: Path) -> dict:
    """One batch size's step: timed first (speed.training_case, unprofiled), then recorded."""
    plan, device = context.plan, context.device
    grid = plan.grids[0]
    timed = training_case(context, attention="soft", fused=True, grid=grid, precision="bf16", batch=batch)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    # the warm-up steps run untraced (the first allocates), then every step after them is recorded
    schedule = torch.profiler.schedule(wait=plan.warmup_steps, warmup=0, active=10**6)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities, profile_memory=True, schedule=schedule) as profiler:
        recorded = training_case(context, attention="soft", fused=True, grid=grid, precision="bf16", batch=batch,
                                 after_step=profiler.step)
    seconds = time.perf_counter() - start
    kernels = kernel_table(profiler, device=device, steps=int(recorded["timed_steps"]))
    write_table(out, batch=batch, grid=grid, kernels=kernels[:HEAVIEST], step_ms=timed["step_ms"])
    heaviest = kernels[0] if kernels else {"kernel": "none", "share": 0.0}
    return {"step_ms": timed["step_ms"], "captions_per_s": timed["captions_per_s"],
            "launches_per_step": sum(row["launches"] for row in kernels),
            "allocated_mib_per_step": sum(row["bytes"] for row in kernels) / 2**20,
            "heaviest": f"{heaviest['kernel']} ({heaviest['share']:.0%})", "profiled_s": seconds}


def write_table(out: Path, *, batch: int, grid: tuple[int, int, int], kernels: list[dict], step_ms: float) -> None:
    """Append one batch size's heaviest kernels to DIR/profile.md."""
    lines = [f"\n## soft fused {grid_name(grid)} bf16 B={batch}: {step_ms:.1f} ms a step (unprofiled)\n",
             "| kernel | ms a step | share | launches a step | allocated MiB a step |", "|---|---|---|---|---|"]
    lines += [f"| `{row['kernel'].replace('|', '/')}` | {row['ms']:.3f} | {row['share']:.1%} | {row['launches']:.0f} | "
              f"{row['bytes'] / 2**20:.2f} |" for row in kernels]
    with out.open("a") as file:
        file.write("\n".join(lines) + "\n")


def profile(context: Context) -> None:
    plan = context.plan
    names = [f"profile soft fused {grid_name(plan.grids[0])} bf16 B={batch}" for batch in plan.profile_batches]
    context.cases.plan(names)
    out = (context.out or context.work) / "profile.md"
    out.write_text("# Where the training step's time goes (benchmarks/gpu/profiling.py)\n")
    for name, batch in zip(names, plan.profile_batches):
        context.cases.run(name, lambda batch=batch: profile_case(context, batch=batch, out=out))
        free_memory(context.device)
