"""benchmarks/gpu/gpu.py's graph part: the training step as one CUDA graph (train.graph,
captioning/train/graphed.py) beside the eager step, in the same process, at the COCO configs' decoder.

Per batch size of the plan: the eager fused step in bf16 (speed.training_case, as the train part
times it), then the graphed step on the same batches (caption lengths 10 to 22 tokens, so every
batch falls in the 24-step bucket), whose row carries `ratio_eager`, the captions/s of the graph
over the eager step's, `capture_s`, the seconds of its first steps (the eager warm-up and the
capture), and the goal it is held to (`goal_captions_per_s`).

At the largest batch the graphed step runs once more with the score in PyTorch (its tanh written
and computed again in the backward) instead of the Triton kernels (captioning/model/score_kernels.py):
that row's `ratio_kernels` is the kernels' step's captions/s over it.

Then `loss_gap`: on a decoder without dropout (a graph's dropout draws other masks than an eager
step's), a replay of the captured graph and an eager step (train_step) from the same weights and
optimizer state on the same batch, |graphed - eager| / eager of the loss. bf16 rounds to 2^-8 of a
value, so a gap below that is rounding; the tests hold the same step to the eager one in float32
(tests/train/test_graphed.py).

Notation: B batch.
"""

from __future__ import annotations

import copy
import time

import torch
from plan import PRECISIONS, Context, free_memory, peak_mib, reset_peak
from report import coco_epochs
from speed import _timed, coco_config, grid_name, host_batches, training_case

from captioning.model import fused
from captioning.model.encoder_decoder import build_decoder
from captioning.runtime.precision import Precision, allow_tf32
from captioning.train.build import RunModel, build_optimizer
from captioning.train.graphed import WARMUP, GraphedStep
from captioning.train.paper_objective import train_step

GOALS = {64: 10_000, 512: 50_000}  # captions/s of the training step, in bf16 on one H200 or H100


def decoder_grid(context: Context) -> tuple[tuple[int, int], int]:
    """The plan's first annotations as RunModel holds them: the grid (Hg, Wg) and the channels D."""
    height, width, channels = context.plan.grids[0]
    return (height, width), channels


def _graphed(context: Context, *, batch: int, precision: str, dropout: bool = True):
    """A decoder of the COCO configs, its fused Adam and its GraphedStep; the batches as a run feeds them."""
    plan, device = context.plan, context.device
    grid = plan.grids[0]
    config = coco_config(context, attention="soft", overrides=() if dropout else ("model.dropout=0",))
    torch.manual_seed(0)
    decoder = build_decoder(config.model, vocab_size=plan.vocab, annotation_dim=grid[2], grid=grid[:2]).to(device)
    optimizer, _ = build_optimizer(config, RunModel(decoder, None, None, *decoder_grid(context)))
    step = GraphedStep(decoder, optimizer, grad_clip=config.train.grad_clip, ds_lambda=config.train.ds_lambda,
                       precision=Precision(device.type, PRECISIONS[precision]))
    batches = [b.to(device, non_blocking=True) for b in host_batches(batch=batch, grid=grid, vocab=plan.vocab,
                                                                      device=device)]
    return config, decoder, optimizer, step, batches


def graphed_case(context: Context, *, batch: int, precision: str) -> dict:
    """Captions/s of the graphed step: its first steps (eager, then the capture) apart, then replays."""
    reset_peak(context.device)
    _, _, optimizer, step, batches = _graphed(context, batch=batch, precision=precision)
    skipped = 0

    def one(index: int) -> None:
        nonlocal skipped
        skipped += step(batches[index % len(batches)]).skipped

    start = time.perf_counter()
    for index in range(WARMUP + 1):  # the eager warm-up, then the capture and its first replay
        one(index)
    capture = time.perf_counter() - start
    seconds, steps = _timed(lambda index: one(WARMUP + 1 + index), plan=context.plan, device=context.device)
    rate = batch * steps / seconds
    graphs = len(step.graphs)
    for group in optimizer.param_groups:  # as the plateau schedule does: the shape's graph is captured again
        group["lr"] *= 0.5
    one(0)
    one(1)
    values = {"captions_per_s": rate, "step_ms": 1000 * seconds / steps, "capture_s": capture,
              "graphs": graphs, "graphs_after_rate_change": len(step.graphs), **peak_mib(context.device),
              **coco_epochs(rate), "timed_steps": steps, "skipped_steps": skipped}
    if batch in GOALS:
        values["goal_captions_per_s"] = GOALS[batch]
    return values


def loss_gap(context: Context, *, batch: int, precision: str) -> float:
    """|graphed - eager| / eager of one step's loss from the same weights, state and batch (no dropout)."""
    config, decoder, optimizer, step, batches = _graphed(context, batch=batch, precision=precision, dropout=False)
    for index in range(WARMUP + 1):  # up to the capture
        step(batches[index % len(batches)])
    twin = copy.deepcopy(decoder)
    twin_optimizer, _ = build_optimizer(config, RunModel(twin, None, None, *decoder_grid(context)))
    twin_optimizer.load_state_dict(optimizer.state_dict())
    probe = batches[0]
    graphed = step(probe).losses["loss"]  # a replay: the shape was captured
    t = config.train
    eager = train_step(twin, probe, twin_optimizer, grad_clip=t.grad_clip, ds_lambda=t.ds_lambda,
                       precision=Precision(context.device.type, PRECISIONS[precision])).losses["loss"]
    return abs(graphed - eager) / abs(eager)


def without_kernels(context: Context, *, batch: int, kernels_rate: float | None) -> dict:
    """graphed_case with the score in PyTorch (fused.KERNELS_ON emptied in this process while it runs)."""
    kept = fused.KERNELS_ON
    fused.KERNELS_ON = frozenset()
    try:
        values = graphed_case(context, batch=batch, precision="bf16")
    finally:
        fused.KERNELS_ON = kept
    if kernels_rate:
        values["ratio_kernels"] = kernels_rate / values["captions_per_s"]
    return values


def graph(context: Context) -> None:
    """Per batch size: the eager bf16 step, then the graphed one with its ratio to it and its loss gap;
    at the largest, the graphed step once more without the score's kernels."""
    plan = context.plan
    grid = plan.grids[0]
    allow_tf32(True)  # as train.tf32 (the default)
    cases = [(batch, f"soft fused {grid_name(grid)} bf16 B={batch}, eager beside the graph",
              f"soft graphed {grid_name(grid)} bf16 B={batch}") for batch in plan.batches]
    largest = max(plan.batches)
    unfused = f"soft graphed {grid_name(grid)} bf16 B={largest}, the score in PyTorch (no Triton kernels)"
    context.cases.plan([name for _, eager, graphed in cases for name in (eager, graphed)] + [unfused])
    rates = {}
    for batch, eager_name, graphed_name in cases:
        eager = context.cases.run(eager_name, lambda b=batch: training_case(
            context, attention="soft", fused=True, grid=grid, precision="bf16", batch=b))
        free_memory(context.device)

        def measured(batch: int = batch, eager: dict | None = eager) -> dict:
            values = graphed_case(context, batch=batch, precision="bf16")
            if eager:
                values["ratio_eager"] = values["captions_per_s"] / eager["captions_per_s"]
            free_memory(context.device)
            values["loss_gap"] = loss_gap(context, batch=batch, precision="bf16")
            return values

        values = context.cases.run(graphed_name, measured)
        rates[batch] = values["captions_per_s"] if values else None
        free_memory(context.device)
    context.cases.run(unfused, lambda: without_kernels(context, batch=largest, kernels_rate=rates.get(largest)))
    free_memory(context.device)
