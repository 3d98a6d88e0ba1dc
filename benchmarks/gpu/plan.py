"""What benchmarks/gpu/gpu.py measures, at which sizes and in how many seconds: the GPU plan (the COCO
configs' dimensions) and the smoke's (tiny sizes, seconds on a CPU), and what a part is handed.

Notation: B batch, (Hg, Wg) the annotation grid, D channels, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from report import Cases

REPO = Path(__file__).resolve().parents[2]
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # fp16 steps with a GradScaler


@dataclass(frozen=True)
class Plan:
    name: str
    # Seconds each part may take, in the order they run (set-up comes before, out of the same total).
    budgets: dict[str, float]
    # Training steps and beam search: annotations (Hg, Wg, D), the COCO configs' decoder with a V-word vocabulary.
    grids: tuple[tuple[int, int, int], ...]
    vocab: int
    model: tuple[str, ...]  # overrides of configs/coco_vgg19_soft.yaml's model (none for the GPU plan)
    batches: tuple[int, ...]  # the fused path's batch sizes
    few_batches: tuple[int, ...]  # the step-by-step path's and hard attention's
    warmup_steps: int
    timed_steps: int  # at most; fewer where timed_seconds runs out first (3 at least)
    timed_seconds: float
    beam_batches: tuple[int, ...]
    beam_length: int  # every caption this many words (<end> forbidden before): the same work for every image
    # Encoders: (name, layer, input side); random weights where the real ones cannot be had.
    encoders: tuple[tuple[str, str, int], ...]
    encoder_batch: int
    # The short real training: the shapes data at this size, the embedded default's config.
    shapes_counts: dict[str, int]
    shapes_size: int
    training: tuple[str, ...]  # overrides of the embedded default for it
    device_epochs: int  # on the GPU; the CPU trains one
    compile_backend: str
    compile_modes: tuple[str, ...]  # torch.compile's modes for the training step, "default" first
    tiny: tuple[str, ...] = field(default=())  # the tiny runs' overrides (checkpoints, torchrun)
    # The port beside ours (port.py): its batch sizes, and its attention, embedding and LSTM widths.
    port_batches: tuple[int, ...] = (64, 512)
    port_widths: tuple[int, int, int] = (512, 512, 512)
    # The profile (profiling.py): the batch sizes whose step is profiled.
    profile_batches: tuple[int, ...] = (64, 256, 512)


# The tiny runs (checkpoint round trip, torchrun): the embedded default cut to a few scenes at 96²
# (a 6x6 grid), as the test suite's tiny runs; what they prove is the path, not the speed.
TINY_COUNTS = {"train": 24, "val": 8, "test": 8}
TINY = ("data.image_size=96", "model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16",
        "train.batch_size=16", "train.epochs=1000", "train.early_stop_patience=1000", "train.lr=0.01",
        "train.val_images=8", "train.log_images=1", "decode.beam_size=2", "decode.max_length=12")

GPU = Plan(
    name="gpu",
    # From the H200's runs (docs/benchmarks.md): each part's seconds there, with room; compile's are
    # mostly its three compiles of the training step, 53 to 84 s each.
    budgets={"paths": 50, "train": 100, "beam": 35, "encoders": 35, "torchrun": 60, "training": 120, "compile": 180,
             "profile": 40, "port": 60, "graph": 60},
    grids=((14, 14, 512), (7, 7, 2048)),  # VGG-19 conv5_4 at 224²; ResNet-101 layer4 at 224²
    vocab=10_000, model=(), batches=(64, 128, 256, 512), few_batches=(64, 256),
    warmup_steps=2, timed_steps=10, timed_seconds=1.5, beam_batches=(32, 256), beam_length=20,
    encoders=(("vgg19", "stride16", 224), ("resnet101", "stride32", 224), ("resnet101", "stride32", 448),
              ("efficientnet_lite2", "stride32", 224)),
    encoder_batch=64,
    shapes_counts={"train": 2000, "val": 250, "test": 0}, shapes_size=224,
    training=("train.val_images=250",), device_epochs=3, compile_backend="inductor",
    compile_modes=("default", "reduce-overhead"), tiny=TINY,
)

SMOKE = Plan(  # every path of the GPU plan once, at the least size that runs it
    name="smoke",
    # generous: a loaded machine (the test suite's) must not turn a slow smoke into cases not run
    budgets={"paths": 120, "train": 60, "beam": 40, "encoders": 40, "torchrun": 90, "training": 120, "compile": 60,
             "profile": 40, "port": 40, "graph": 40},
    grids=((3, 3, 8),), vocab=50,
    model=("model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16"),
    batches=(4,), few_batches=(4,), warmup_steps=1, timed_steps=2, timed_seconds=0.5, beam_batches=(2,),
    beam_length=5, encoders=(("resnet18", "stride16", 64),), encoder_batch=2,
    shapes_counts=TINY_COUNTS, shapes_size=96,
    training=(*TINY[1:4], "train.val_images=8", "train.log_images=1"), device_epochs=1,
    # dynamo's tracing without code generation: what breaks the graph shows in seconds on a CPU
    compile_backend="eager", compile_modes=("default",), tiny=TINY,
    port_batches=(4,), port_widths=(16, 16, 32), profile_batches=(4,),
)


@dataclass
class Context:
    """What a part is handed: the plan, the device, a folder for its files and its cases' rows."""

    plan: Plan
    device: torch.device
    work: Path  # shared by the parts of one run (the tiny data is made once)
    cases: Cases
    out: Path | None = None  # the command's --out, for what a part keeps beside gpu.md (profile.md)


def tiny_data(context: Context) -> Path:
    """The tiny shapes data with its feature cache (computed on the part's device), made once per run."""
    return shapes_data(context.work / "tiny", counts=TINY_COUNTS, image_size=96, overrides=TINY,
                       device=context.device)


def shapes_data(root: Path, *, counts: dict[str, int], image_size: int, overrides: tuple[str, ...],
                device: torch.device, workers: int = 0) -> Path:
    """The shapes data under `root` (made by the package's own generator) with its feature cache,
    unless a finished one is there already."""
    from captioning.config import load_config
    from captioning.data.shapes.scenes import make_shapes
    from captioning.data.splits import load_splits

    done = root / ".made"
    if not done.exists():
        make_shapes(root, counts, seed=0, image_size=image_size)
        splits = tuple(name for name, count in counts.items() if count)
        load_splits(load_config(None, [f"data.root={root}", *overrides]), splits, device=device, num_workers=workers)
        done.touch()
    return root


def free_memory(device: torch.device) -> None:
    """After a case, and after one that failed (an out-of-memory error leaves its blocks cached)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mib(device: torch.device) -> dict[str, float]:
    """The peak GPU memory since the last reset, as a row's value (nothing on a CPU)."""
    return {"peak_gpu_mib": torch.cuda.max_memory_allocated(device) / 2**20} if device.type == "cuda" else {}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
