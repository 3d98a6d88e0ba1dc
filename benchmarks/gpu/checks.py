"""benchmarks/gpu/gpu.py's part "paths": the package's device paths run for real, each a case that
passes with its numbers or fails with its cause.

The device, the precision train.amp picks there, a bf16 autocast step against a float32 one, fp16
with the GradScaler (a finite step, then an overflow that is skipped while the scale backs off), the
fp16 cache's half batches pinned and widened on the device, `train.py --dry-run` of the embedded
default, and a checkpoint written on the device, resumed on the CPU, resumed on the device again and
captioned from on both. Every step goes through the package's own code (train_step, fit, dry_run,
Captioner), never a copy of it.

Notation: B batch, T caption steps, L grid cells, D channels.
"""

from __future__ import annotations

import copy
import platform
from pathlib import Path

import torch
from plan import Context, tiny_data

from captioning.checkpoint import load_checkpoint
from captioning.config import load_config
from captioning.data.dataset import Batch, collate
from captioning.model.encoder_decoder import build_decoder
from captioning.runtime.precision import Precision, native_bf16, precision_for
from captioning.train.paper_objective import train_step


def paths(context: Context) -> None:
    device, cases = context.device, context.cases
    there = device.type
    cases.plan(["device", "train.amp's precision", "bf16 autocast step", "fp16 with the scaler, an overflow skipped",
                "half batches, pinned", "dry run (embedded default)", f"checkpoint: {there} -> cpu -> {there}",
                f"caption from the {there} checkpoint on cpu and {there}"])
    cases.run("device", lambda: describe_device(device))
    cases.run("train.amp's precision", lambda: {"reason": precision_for(device, amp=True).reason})
    cases.run("bf16 autocast step", lambda: autocast_step(device))
    cases.run("fp16 with the scaler, an overflow skipped", lambda: scaled_fp16(device))
    cases.run("half batches, pinned", lambda: half_batches(device))
    cases.run("dry run (embedded default)", lambda: dry_run_here(context))
    checkpoint = context.work / "round_trip"
    cases.run(f"checkpoint: {there} -> cpu -> {there}", lambda: round_trip(context, checkpoint))
    cases.run(f"caption from the {there} checkpoint on cpu and {there}", lambda: caption_both(context, checkpoint))


def describe_device(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "cpu_threads": torch.get_num_threads()}
    if device.type != "cuda":
        return {**info, "device": "cpu (no CUDA: the smoke)"}
    props = torch.cuda.get_device_properties(device)
    return {**info, "device": props.name, "gpus": torch.cuda.device_count(),
            "capability": f"{props.major}.{props.minor}", "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "native_bf16": native_bf16(device)}


def _tiny_decoder(device: torch.device, *, seed: int = 0):
    config = load_config(None, ["model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16"])
    torch.manual_seed(seed)
    return build_decoder(config.model, vocab_size=20, annotation_dim=8, grid=(3, 3)).to(device)


def _tiny_batch(device: torch.device, *, rows: int = 6) -> Batch:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 20, (rows, 7), generator=generator)  # [B, T]
    tokens[:, 0], tokens[:, -1] = 1, 2  # <start> .. <end>
    return Batch(annotations=torch.randn(rows, 9, 8, generator=generator), tokens=tokens,
                 lengths=torch.full((rows,), 7)).to(device)


def autocast_step(device: torch.device) -> dict:
    """One step under bf16 autocast against the same step in float32, from the same weights and dropout."""
    mixed, full = _tiny_decoder(device), _tiny_decoder(device)
    batch = _tiny_batch(device)
    losses = []
    for decoder, dtype in ((mixed, torch.bfloat16), (full, None)):
        torch.manual_seed(1)  # the same dropout masks
        result = train_step(decoder, batch, torch.optim.SGD(decoder.parameters(), lr=0.1), grad_clip=5.0,
                            ds_lambda=1.0, precision=Precision(device.type, dtype))
        assert not result.skipped, "the step was skipped"
        losses.append(result.losses["loss"])
    apart = abs(losses[0] - losses[1]) / losses[1]
    moved = max(float((a - b).abs().max()) for a, b in zip(mixed.state_dict().values(), full.state_dict().values()))
    assert apart < 0.05, f"bf16 loss {losses[0]:.4f} against float32 {losses[1]:.4f}"
    return {"loss_bf16": losses[0], "loss_fp32": losses[1], "relative_gap": apart, "largest_weight_gap": moved}


def scaled_fp16(device: torch.device) -> dict:
    """fp16 autocast with a GradScaler: a finite step keeps the scale; an overflow is skipped, leaves
    the weights as they were and halves the scale."""
    decoder = _tiny_decoder(device)
    precision = Precision(device.type, torch.float16)
    scaler = precision.scaler()
    optimizer = torch.optim.SGD(decoder.parameters(), lr=0.1)
    batch = _tiny_batch(device)
    finite = train_step(decoder, batch, optimizer, grad_clip=5.0, ds_lambda=1.0, precision=precision, scaler=scaler)
    kept = scaler.get_scale()
    assert not finite.skipped and kept == 2.0**16, f"a finite step: skipped {finite.skipped}, scale {kept}"
    before = copy.deepcopy(decoder.state_dict())
    overflow = copy.copy(batch)
    overflow.annotations = batch.annotations.clone()
    overflow.annotations[0, 0, 0] = float("inf")
    skipped = train_step(decoder, overflow, optimizer, grad_clip=5.0, ds_lambda=0.0, precision=precision,
                         scaler=scaler)
    assert skipped.skipped, "the overflowing step was applied"
    assert scaler.get_scale() == 2.0**15, f"scale {scaler.get_scale()} after an overflow, not 2^15"
    assert all(torch.equal(before[k], v) for k, v in decoder.state_dict().items()), "an overflow moved the weights"
    return {"scale_after_finite": kept, "scale_after_overflow": scaler.get_scale()}


def half_batches(device: torch.device) -> dict:
    """The cache's fp16 rows collated, pinned (as DataLoader(pin_memory=True) does on a GPU), moved
    without blocking and widened to float32 there: the same numbers."""
    generator = torch.Generator().manual_seed(0)
    items = [(torch.randn(9, 8, generator=generator).half(), [1, 5, 6, 2]) for _ in range(4)]  # ([L, D], ids)
    batch = collate(items)
    assert batch.annotations.dtype == torch.float16
    pinned = batch.pin_memory() if device.type == "cuda" else batch
    moved = pinned.to(device, non_blocking=True)
    assert moved.annotations.dtype == torch.float32 and moved.annotations.device.type == device.type
    assert torch.equal(moved.annotations.cpu(), batch.annotations.float()), "fp16 -> float32 changed a value"
    return {"pinned": bool(pinned.annotations.is_pinned()), "dtype_on_device": str(moved.annotations.dtype)}


def dry_run_here(context: Context) -> dict:
    """`train.py --dry-run` of the embedded default on this device: it makes its own few scenes."""
    from captioning.train.dry_run import dry_run

    config = load_config(None, [f"data.root={context.work / 'no_data_here'}"])  # the dry run makes its scenes
    result = dry_run(config, device=context.device)
    return {"steps": result.steps, result.metric: result.value, "seconds": result.seconds}


def round_trip(context: Context, out: Path) -> dict:
    """A tiny run with train.amp: two steps on the device, two more resumed on the CPU from its
    last.pt, two more resumed on the device again; each leg's checkpoint read back."""
    from captioning.train.loop import fit

    root = tiny_data(context)
    there = context.device.type
    legs, seen = [(there, 2), ("cpu", 4), (there, 6)], []
    for leg, (device, steps) in enumerate(legs):
        config = load_config(None, [f"data.root={root}", *context.plan.tiny, f"train.out_dir={out}", "train.amp=true",
                                    f"train.max_steps={steps}"])
        summary = fit(config, resume=leg > 0, device=device)
        saved = load_checkpoint(Path(summary["last"]))
        reached = saved["progress"]["step"]
        assert reached == steps, f"leg {leg + 1} on {device} stopped at step {reached}"
        assert ("cuda" in saved["rng"]) == (device == "cuda"), f"leg {leg + 1}: the GPU's RNG state is not as expected"
        assert all(torch.isfinite(t).all() for t in saved["decoder"].values()), f"leg {leg + 1}: weights not finite"
        seen.append(f"{device}:{steps}")
    return {"legs": seen, "precision": precision_for(context.device, amp=True).reason.split(" (")[0]}


def caption_both(context: Context, out: Path) -> dict:
    """The round trip's checkpoint captions a test image on the CPU and on the device alike."""
    from captioning.api import Captioner

    image = next((context.work / "tiny" / "images" / "test").glob("*.png"))
    captions = {}
    for device in dict.fromkeys(["cpu", context.device.type]):
        captioner = Captioner.from_checkpoint(out / "last.pt", device=device)
        captions[device] = captioner.caption(image).caption
    # Not asserted equal: beam search on two devices may part ways where two words score alike.
    return {**{f"caption_{device}": repr(caption) for device, caption in captions.items()},
            "same": len(set(captions.values())) == 1}
