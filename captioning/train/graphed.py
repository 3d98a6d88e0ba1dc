"""The paper's training step, the whole of it (forward, Eq. 14's loss, backward, clipping, Adam),
replayed as one CUDA graph per batch shape (train.graph).

Notation: B batch, T caption steps (a bucket's), L grid cells, D channels.

A step of the fused path launches a few thousand kernels, and up to a few hundred captions a GPU
waits on the launches, not the arithmetic (docs/benchmarks.md). A CUDA graph records the launches
of one step once and replays them as one. What that asks of the step:

- Shapes repeat. Each batch's captions are padded to a length bucket (`bucket_length`: the next
  multiple of BUCKET), and every row runs every step of it, as the rows of the step-by-step path
  without lengths do (model/packing.py); the losses' mask keeps the padding out of every term, so
  the numbers are the eager step's. The rows past their caption's end cost arithmetic, not launches.
- Nothing goes to the host inside the step. Whether a step is skipped (its loss or gradient norm not
  finite) is decided on the device: fused Adam takes a `found_inf` flag and leaves the weights, its
  moments and its step count as they were where it is set, as it does for a GradScaler.
- The fast path's check of itself (model/fused_check.py) and the optimizer's first state are made
  outside the graph: a shape's first WARMUP steps run eagerly, each a real step on its own batch, on
  a side stream as CUDA asks; its next step captures the graph (recording, not running) and replays it.

Off CUDA the same static step runs eagerly, step by step: what the tests hold against the eager step,
as they hold its capture and replays on a CPU stand-in for CUDA graphs (tests/cuda_graphs.py).
It serves the paper's objective on soft attention with the fused path, in one process, on cached
annotations, in float32 or bf16 (config/checks.py refuses the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from captioning.data.dataset import Batch
from captioning.data.vocab import Vocabulary
from captioning.model.paper import cross_entropy, doubly_stochastic
from captioning.runtime.hardware import floats
from captioning.runtime.precision import FULL_PRECISION, Precision
from captioning.train.objective import StepResult

BUCKET = 8  # caption steps: batches are padded to a multiple of this (COCO's 22 steps: 3 buckets)
WARMUP = 3  # eager steps of a shape before its graph is captured (CUDA's documented minimum is a few)


def bucket_length(steps: int) -> int:
    """The bucket a batch of `steps` caption steps is padded to: the next multiple of BUCKET."""
    return -(-steps // BUCKET) * BUCKET


@dataclass
class _Captured:
    """One shape's graph and its static tensors: what a replay reads, and what it writes."""

    graph: torch.cuda.CUDAGraph
    annotations: torch.Tensor  # [B, L, D]
    tokens: torch.Tensor  # [B, T + 1]
    outputs: tuple[torch.Tensor, ...]  # loss, xe, ds, grad norm, skipped (0-dim)


class GraphedStep:
    """One optimizer step of the paper's loss on a batch of cached annotations: eager for a shape's
    first WARMUP steps, then captured once and replayed (on CUDA); eager always elsewhere."""

    def __init__(self, decoder: torch.nn.Module, optimizer: torch.optim.Optimizer, *, grad_clip: float,
                 ds_lambda: float, precision: Precision = FULL_PRECISION, word_weights: torch.Tensor | None = None,
                 capture: bool | None = None):
        if not all(group.get("fused") for group in optimizer.param_groups):
            raise ValueError("train.graph needs fused Adam: its found_inf flag skips a step on the device")
        self.decoder, self.optimizer, self.grad_clip, self.ds_lambda = decoder, optimizer, grad_clip, ds_lambda
        self.precision, self.word_weights = precision, word_weights
        self.parameters = [p for p in decoder.parameters() if p.requires_grad]
        device = self.parameters[0].device
        self.capture = device.type == "cuda" if capture is None else capture
        # 1.0 where this step's loss or gradient norm is not finite: fused Adam then leaves everything as it was.
        self.found_inf = torch.zeros((), device=device)
        optimizer.found_inf = self.found_inf
        self.seen: dict[tuple[int, ...], int] = {}  # eager steps taken per shape
        self.graphs: dict[tuple[int, ...], _Captured] = {}
        self.pool = None  # one memory pool for all shapes' graphs: made at the first step, again at a new rate
        self.side = torch.cuda.Stream() if self.capture else None  # warm-up steps run here, as CUDA graphs ask
        self.rates: list[float] = []  # the learning rates the graphs were captured with

    def __call__(self, batch: Batch) -> StepResult:
        """One step on `batch` (on the decoder's device; tokens [B, T + 1], padded to its longest caption)."""
        tokens = F.pad(batch.tokens, (0, bucket_length(batch.tokens.shape[1] - 1) + 1 - batch.tokens.shape[1]),
                       value=Vocabulary.pad_id)  # [B, T_bucket + 1]
        annotations = batch.annotations
        shape = (*annotations.shape, tokens.shape[1])
        rates = [float(group["lr"]) for group in self.optimizer.param_groups]
        if rates != self.rates:  # a graph holds the rate it was captured with: the schedule moved it
            self.graphs.clear()
            # and a fresh pool: the old one keeps what a capture's stream allocated for good (cuBLAS's
            # workspace), and the allocator refuses a new capture into a pool whose graphs are gone
            self.pool = torch.cuda.graph_pool_handle() if self.capture else None
            self.rates = rates
        captured = self.graphs.get(shape)
        if captured is not None:
            captured.annotations.copy_(annotations, non_blocking=True)
            captured.tokens.copy_(tokens, non_blocking=True)
            captured.graph.replay()
            outputs = captured.outputs
        elif self.capture and self.seen.get(shape, 0) >= WARMUP:
            outputs = self._capture(shape, annotations, tokens)
        else:
            self.seen[shape] = self.seen.get(shape, 0) + 1
            outputs = self._eager(annotations, tokens)
        loss, xe, ds, norm, skipped = floats(*outputs)  # one trip to the host
        return StepResult({"loss": loss, "xe": xe, "ds": ds, "grad_norm": norm}, skipped=bool(skipped))

    def step(self, annotations: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The static step: nothing in it reads a value on the host, so a graph can hold it. Gradients
        must be None before it (zero_grad(set_to_none=True)): backward writes them fresh. annotations
        [B, L, D], tokens [B, T + 1] -> loss, xe, ds, grad norm, skipped (0-dim, on the device)."""
        self.decoder.train()
        inputs, targets = tokens[:, :-1], tokens[:, 1:]  # [B, T]
        mask = (targets != Vocabulary.pad_id).float()  # [B, T], padding reaches no term
        with self.precision.autocast():
            output = self.decoder(annotations, inputs)  # every row runs every step of the bucket
        xe = cross_entropy(output.logits.float(), targets, mask, word_weights=self.word_weights)
        ds = doubly_stochastic(output.alphas.float(), mask)
        loss = xe + self.ds_lambda * ds  # Eq. 14
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.grad_clip)
        skipped = (~(torch.isfinite(loss) & torch.isfinite(norm))).float()
        self.found_inf.copy_(skipped)
        self.optimizer.step()  # fused Adam: nothing moves where found_inf is 1
        return loss.detach(), xe.detach(), ds.detach(), norm, skipped

    def _eager(self, annotations: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.optimizer.zero_grad(set_to_none=True)
        if not self.capture:
            return self.step(annotations, tokens)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            outputs = self.step(annotations, tokens)
        torch.cuda.current_stream().wait_stream(self.side)
        return outputs

    def _capture(self, shape: tuple[int, ...], annotations: torch.Tensor,
                 tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Record this shape's step as a graph, then replay it on this batch: the recording runs nothing."""
        static_annotations, static_tokens = annotations.clone(), tokens.clone()
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates its own gradients
        groups = self.optimizer.param_groups
        kept = [group["capturable"] for group in groups]
        graph = torch.cuda.CUDAGraph()
        try:
            for group in groups:  # torch refuses to capture Adam's step otherwise (its step counts on the device)
                group["capturable"] = True
            # thread_local: the loader's pinning thread may touch CUDA while this thread records
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                outputs = self.step(static_annotations, static_tokens)
        finally:
            # fused Adam launches the same kernels either way, but torch warns when a capturable
            # optimizer steps outside a capture (another shape's warm-up), and a checkpoint would keep it
            for group, capturable in zip(groups, kept):
                group["capturable"] = capturable
        self.graphs[shape] = _Captured(graph, static_annotations, static_tokens, outputs)
        graph.replay()
        return outputs
