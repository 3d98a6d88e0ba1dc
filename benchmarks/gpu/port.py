"""benchmarks/gpu/gpu.py's port part: the most used port of Show, Attend and Tell, timed as its own code
beside the package's training step, in the same process, at the same sizes.

The port is sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning: its `models.py` (DecoderWithAttention),
imported unchanged from --port DIR (git-ignored; `make gpu-port` clones it there, and the GPU
machine gets it carried with the tree: it is never committed). Its step is its train.py's: the
decoder's forward over annotations [B, 14, 14, 512] (its layout), pack_padded_sequence over the
sorted predictions, cross-entropy plus its doubly stochastic term (alpha_c = 1), backward, each
gradient clamped at ±5 (its clip_gradient), Adam, and `loss.item()` for its meter, all in float32
as its code runs (matmuls in full float32, PyTorch's default, which its code leaves as it is).

Beside it, the package's soft fused step on the same sizes and the same caption lengths: as one
CUDA graph in bf16 (train.graph with train.amp: graphs.graphed_case), eager in bf16
(speed.training_case) and eager in fp32 with TF32 (train.tf32, the default). The row of the port
carries our captions/s over the port's: `ratio` (the graph's, the package's fastest step),
`ratio_eager` (eager bf16) and `ratio_fp32`.

Notation: B batch, T caption steps, (Hg, Wg) grid, D channels, V vocabulary.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch
from graphs import graphed_case
from plan import REPO, Context, free_memory, peak_mib, reset_peak
from report import NotRun, coco_epochs
from speed import LONGEST, SHORTEST, _timed, grid_name, training_case

from captioning.runtime.precision import allow_tf32

# Where the port's code is: --port DIR, handed to the part's process in this variable.
PORT_DIR = REPO / "third_party" / "sgrvinod"
PORT_VARIABLE = "CAPTIONING_PORT_DIR"
PORT_NAME = "sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning DecoderWithAttention"
GRAD_CLIP, ALPHA_C = 5.0, 1.0  # its train.py's


def port_module(folder: Path) -> ModuleType:
    """The port's models.py, imported from `folder` as it is (NotRun where it is not there)."""
    path = folder / "models.py"
    if not path.is_file():
        raise NotRun(f"the port's code is not in {folder} (make gpu-port clones it there; carry it to the GPU machine)")
    spec = importlib.util.spec_from_file_location("port_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["port_models"] = module
    spec.loader.exec_module(module)
    return module


def port_batches(*, batch: int, grid: tuple[int, int, int], vocab: int, device: torch.device,
                 count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`count` batches in the port's layout: annotations [B, Hg, Wg, D] float32, captions [B, T] of
    speed.host_batches' lengths (10 to 22 tokens, <start> and <end> included), lengths [B, 1]."""
    generator = torch.Generator().manual_seed(1)
    height, width, channels = grid
    annotations = torch.randn(batch, height, width, channels, generator=generator).to(device)  # [B, Hg, Wg, D]
    batches = []
    for _ in range(count):
        lengths = torch.randint(SHORTEST, LONGEST + 1, (batch, 1), generator=generator)  # [B, 1]
        captions = torch.randint(4, vocab, (batch, LONGEST), generator=generator)  # [B, T], padded past each length
        batches.append((annotations, captions.to(device), lengths.to(device)))
    return batches


def port_case(context: Context, *, batch: int, grid: tuple[int, int, int]) -> dict:
    """The port's training step, as its train.py runs it, warmed up and then timed."""
    from torch.nn.utils.rnn import pack_padded_sequence

    plan, device = context.plan, context.device
    models = port_module(Path(os.environ.get(PORT_VARIABLE, PORT_DIR)))
    reset_peak(device)
    torch.manual_seed(0)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default, which the port runs under
    attention, embed, hidden = plan.port_widths  # the COCO configs' 512s; the smoke's, the plan's narrow ones
    decoder = models.DecoderWithAttention(attention_dim=attention, embed_dim=embed, decoder_dim=hidden,
                                          vocab_size=plan.vocab, encoder_dim=grid[2], dropout=0.5).to(device)
    decoder.train()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=4e-4)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    batches = port_batches(batch=batch, grid=grid, vocab=plan.vocab, device=device)

    def step(index: int) -> None:
        images, captions, lengths = batches[index % len(batches)]
        scores, sorted_captions, decode_lengths, alphas, _ = decoder(images, captions, lengths)
        targets = sorted_captions[:, 1:]
        scores = pack_padded_sequence(scores, decode_lengths, batch_first=True).data
        targets = pack_padded_sequence(targets, decode_lengths, batch_first=True).data
        loss = criterion(scores, targets) + ALPHA_C * ((1.0 - alphas.sum(dim=1)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        for group in optimizer.param_groups:  # its utils.clip_gradient
            for parameter in group["params"]:
                if parameter.grad is not None:
                    parameter.grad.data.clamp_(-GRAD_CLIP, GRAD_CLIP)
        optimizer.step()
        loss.item()  # its AverageMeter's update: one trip to the host a step

    try:
        for index in range(plan.warmup_steps):
            step(index)
        seconds, steps = _timed(lambda index: step(plan.warmup_steps + index), plan=plan, device=device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    rate = batch * steps / seconds
    return {"captions_per_s": rate, "step_ms": 1000 * seconds / steps, **peak_mib(device), **coco_epochs(rate),
            "timed_steps": steps}


def ours_case(context: Context, way: tuple[str, str], *, batch: int) -> dict:
    """Our step at the port's sizes: (path, precision), the path "graphed" or "fused" (eager)."""
    path, precision = way
    if path == "graphed":
        return graphed_case(context, batch=batch, precision=precision)
    return training_case(context, attention="soft", fused=True, grid=context.plan.grids[0], precision=precision,
                         batch=batch)


def port(context: Context) -> None:
    """Per batch size: ours as a graph in bf16, eager in bf16 and in fp32 (TF32), then the port, whose
    row carries our ratios."""
    plan = context.plan
    grid = plan.grids[0]
    allow_tf32(True)  # ours as train.tf32 (the default) runs; the port's case sets PyTorch's default for itself
    ways = {"ratio": ("graphed", "bf16"), "ratio_eager": ("fused", "bf16"), "ratio_fp32": ("fused", "fp32")}
    cases = []
    for batch in plan.port_batches:
        ours = {key: f"ours soft {path} {grid_name(grid)} {precision} B={batch}"
                for key, (path, precision) in ways.items()}
        cases.append((batch, ours, f"{PORT_NAME} {grid_name(grid)} fp32 B={batch}"))
    context.cases.plan([name for _, ours, theirs in cases for name in (*ours.values(), theirs)])
    for batch, ours, theirs in cases:
        rates = {}
        for key, name in ours.items():
            values = context.cases.run(name, lambda way=ways[key], b=batch: ours_case(context, way, batch=b))
            rates[key] = values["captions_per_s"] if values else None
            free_memory(context.device)

        def theirs_with_ratios(batch: int = batch, rates: dict = rates) -> dict:
            values = port_case(context, batch=batch, grid=grid)
            for key, rate in rates.items():
                if rate:
                    values[key] = rate / values["captions_per_s"]
            return values

        context.cases.run(theirs, theirs_with_ratios)
        free_memory(context.device)
