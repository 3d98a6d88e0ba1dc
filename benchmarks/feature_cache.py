"""Time per training epoch with the annotation cache vs. the encoder run on the fly.

    python benchmarks/feature_cache.py --root data/shapes_bench --steps 20

Uses the embedded default (configs/shapes_soft.yaml: EfficientNet-Lite0 stride 16 at 224², batch
64). Both modes run the same training steps (Run.step: the loader, the forward and backward, the
optimizer) for `--steps` batches after `--warmup` untimed ones; an epoch is then the measured time
per step times the steps of one epoch of the full embedded default (4000 images x 5 captions / 64).
The cache's one-time cost (encoding each image once) is measured too. The shapes data here is
smaller than the default's (the per-step time does not depend on it) to keep the run short.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import torch

from captioning.config import load_config
from captioning.data.features import write_cache
from captioning.data.records import read_records
from captioning.data.sampling import epoch_batches
from captioning.data.shapes.scenes import SHAPES_DEFAULT_COUNTS, make_shapes
from captioning.data.splits import load_splits
from captioning.model.encoder import Encoder
from captioning.runtime.hardware import Hardware
from captioning.train.loop import Run
from captioning.train.signals import StopSignals

REPO = Path(__file__).resolve().parents[1]


def time_steps(overrides: list[str], *, steps: int, warmup: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds per step (CPU time of this process, all its threads: on a shared
    machine it says how much work a step is, whatever else runs)."""
    config = load_config(REPO / "configs" / "shapes_soft.yaml", overrides)
    run = Run.start(config, resume=False, hardware=Hardware.setup("cpu", amp=False))
    batches = epoch_batches(run.data.pairs.lengths, batch_size=config.train.batch_size, seed=0, epoch=0)
    loader = iter(run.loader(batches[: warmup + steps]))
    with StopSignals():
        for _ in range(warmup):
            run.step(next(loader))
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            run.step(next(loader))
        seconds, cpu = (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps
    run.close()
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="data/shapes_bench")
    parser.add_argument("--train-images", type=int, default=400)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=0, help="0: CPU time covers image decoding too")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (more spin on a busy machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(args.root)
    if not (root / "dataset_shapes.json").exists():
        make_shapes(root, {"train": args.train_images, "val": 8, "test": 8})
    common = [f"data.root={root}", f"train.out_dir={root / 'runs'}", f"train.num_workers={args.num_workers}"]

    config = load_config(REPO / "configs" / "shapes_soft.yaml", common)
    records = read_records(config.data, "train")
    with tempfile.TemporaryDirectory() as scratch:  # the one-time cost, always measured from scratch
        start, cpu = time.perf_counter(), time.process_time()
        write_cache(Path(scratch), "train", records, encoder=Encoder.from_config(config.encoder),
                    image_size=config.data.image_size, batch_size=config.encoder.batch_size)
        cache_seconds, cache_cpu = time.perf_counter() - start, time.process_time() - cpu
    load_splits(config, ("train",), num_workers=args.num_workers)  # the run's own cache, if not there yet
    (cached, cached_cpu) = time_steps(common, steps=args.steps, warmup=args.warmup)
    (live, live_cpu) = time_steps([*common, "data.feature_cache=false"], steps=args.steps, warmup=args.warmup)

    images = sum(SHAPES_DEFAULT_COUNTS.values())
    steps_per_epoch = math.ceil(SHAPES_DEFAULT_COUNTS["train"] * 5 / config.train.batch_size)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.num_workers} loader workers")
    print(f"cache build: {cache_seconds:.1f} s wall, {cache_cpu:.1f} s CPU for {len(records)} images -> "
          f"{cache_cpu / len(records) * images:.0f} s CPU once for the default's {images} images")
    for name, (a, b) in {"wall-clock": (cached, live), "CPU time": (cached_cpu, live_cpu)}.items():
        print(f"{name} per step (batch {config.train.batch_size}): cached {a * 1000:.0f} ms, "
              f"on the fly {b * 1000:.0f} ms; per epoch ({steps_per_epoch} steps): cached {a * steps_per_epoch:.0f} s, "
              f"on the fly {b * steps_per_epoch:.0f} s, speed-up {b / a:.1f}x")


if __name__ == "__main__":
    main()
