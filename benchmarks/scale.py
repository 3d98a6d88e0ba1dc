"""A COCO-sized stand-in, made here, and the time and memory of a stage at 1 000, 10 000 and 123 287 images.

    python benchmarks/scale.py write --root /tmp/scale            # the three corpora (a few minutes)
    python benchmarks/scale.py prepare --root /tmp/scale          # `captioning prepare` on each
    python benchmarks/scale.py scst --root /tmp/scale             # SCST's CIDEr-D set-up and rewards (after prepare)

The corpus has COCO's Karpathy counts at full size (113 287 training images, restval included,
5 000 validation, 5 000 test; five captions each, a few with six or seven: 616 767 captions) and
the same proportions at 1 000 and 10 000 images. Captions follow COCO's length (about 10.5 words,
6 to 50) over a Zipf-like vocabulary (exponent 1.4 over 50 000 words), which leaves about COCO's
10 000 words seen at least 5 times at full size. Every image file is a link to one small JPEG:
the stages measured here read names and captions, and the encoder's cost per image is measured on
its own (docs/benchmarks.md). Each stage runs as its own process: wall time and peak resident
memory (the kernel's maxrss of the child), with the exponent of the growth from 10 000 to 123 287
images (1 is linear).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
FULL = {"train": 82_783, "restval": 30_504, "val": 5_000, "test": 5_000}  # 123 287 images
SIZES = {"1k": 1_000, "10k": 10_000, "full": sum(FULL.values())}
WORDS, EXPONENT = 50_000, 1.4


def split_counts(images: int) -> dict[str, int]:
    """Karpathy's split of `images` images, in COCO's proportions (COCO's own counts at full size)."""
    total = sum(FULL.values())
    counts = {name: count * images // total for name, count in FULL.items()}
    counts["train"] += images - sum(counts.values())
    return counts


def write(root: Path, images: int, *, seed: int = 0) -> None:
    """ROOT/dataset_coco.json and ROOT/{train2014,val2014}/COCO_*.jpg (links to one JPEG)."""
    rng = np.random.default_rng(seed)
    probabilities = 1.0 / np.arange(1, WORDS + 1) ** EXPONENT
    probabilities /= probabilities.sum()
    extra = rng.random(images)  # six captions for about 0.27% of the images, seven for a few (COCO: 616 767)
    per_image = 5 + (extra < 0.0027) + (extra < 0.0001)
    lengths = np.clip(np.rint(rng.normal(10.5, 2.4, size=int(per_image.sum()))), 6, 50).astype(int)
    words = rng.choice(WORDS, size=int(lengths.sum()), p=probabilities)
    ends = np.cumsum(lengths)
    sentences = [" ".join(f"w{w}" for w in words[end - n:end]) for end, n in zip(ends, lengths)]
    source = root / "blank.jpg"
    root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 48), (120, 110, 100)).save(source, quality=90)
    entries, caption = [], 0
    splits = [name for name, count in split_counts(images).items() for _ in range(count)]
    for cocoid, (split, count) in enumerate(zip(splits, per_image)):
        folder = "train2014" if split in ("train", "restval") else "val2014"
        name = f"COCO_{folder}_{cocoid:012d}.jpg"
        (root / folder).mkdir(exist_ok=True)
        target = root / folder / name
        if not target.exists():
            target.symlink_to(source)
        entries.append({"filepath": folder, "filename": name, "cocoid": cocoid, "split": split,
                        "sentences": [{"raw": s} for s in sentences[caption:caption + count]]})
        caption += count
    (root / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": entries}))


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident GB) of a child process."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # kB, the largest child so far
    if peak <= before:
        peak = float("nan")  # hidden by a larger earlier child: run the sizes smallest first
    return time.perf_counter() - start, peak / 1e6


def prepare(root: Path) -> None:
    rows = {}
    for label, images in SIZES.items():
        data, out = root / label, root / "runs" / label
        rows[label] = timed([sys.executable, "-m", "captioning.cli", "prepare", "--config",
                             "configs/coco_vgg19_soft.yaml", f"data.root={data}", f"train.out_dir={out}", "--quiet"])
        vocab = len(json.loads((out / "vocab.json").read_text()))
        print(f"{label:>5} ({images:,} images): {rows[label][0]:.1f} s, peak {rows[label][1]:.2f} GB, "
              f"vocabulary {vocab:,}", flush=True)
    growth = math.log(SIZES["full"] / SIZES["10k"])
    print(f"growth 10k -> full: time x^{math.log(rows['full'][0] / rows['10k'][0]) / growth:.2f}, "
          f"memory x^{math.log(rows['full'][1] / rows['10k'][1]) / growth:.2f}")


def scst_child(data: Path, out: Path) -> None:
    """In its own process: SCST's reward set-up on the training split (document frequencies of its
    references: SelfCritical.from_config), the reward of one batch (64 images x 5 samples, each
    image's references seen for the first time), then a reward for every training image once, as an
    epoch leaves the store of reference vectors. Prints the times as JSON."""
    from captioning.config import load_config
    from captioning.data.coco import read_records
    from captioning.data.vocab import Vocabulary, tokenize
    from captioning.train.scst import SelfCritical

    def resident() -> float:  # GB now
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9

    config = load_config(REPO / "configs" / "coco_vgg19_scst.yaml", [f"data.root={data}"])
    records = read_records(config.data, "train")
    vocab = Vocabulary.load(out / "vocab.json")
    candidates = [tokenize(record.captions[0]) for record in records]
    before = resident()
    start = time.perf_counter()
    critic = SelfCritical.from_config(config.train.scst, records=records, vocab=vocab,
                                      max_length=config.decode.max_length)
    setup, after_setup = time.perf_counter() - start, resident()
    start = time.perf_counter()
    batch = [i for i in range(64) for _ in range(5)]
    critic.cider.scores([candidates[i] for i in batch], batch)
    one_batch = time.perf_counter() - start
    start = time.perf_counter()
    for first in range(0, len(records), 64):  # a batch of images a step, as training calls it
        rows = list(range(first, min(first + 64, len(records))))
        critic.cider.scores([candidates[i] for i in rows], rows)
    epoch = time.perf_counter() - start
    print(json.dumps({"setup_s": setup, "batch_s": one_batch, "every_image_s": epoch,
                      "store_after_setup_gb": after_setup - before, "store_after_epoch_gb": resident() - before}))


def scst(root: Path) -> None:
    rows = {}
    for label, images in SIZES.items():
        command = [sys.executable, str(Path(__file__).resolve()), "scst-child", "--root", str(root / label),
                   "--out", str(root / "runs" / label)]
        start = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        done = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        peak = peak / 1e6 if peak > before else float("nan")
        times = json.loads(done.stdout.strip().splitlines()[-1])
        rows[label] = (times["setup_s"], peak)
        print(f"{label:>5} ({images:,} images): set-up {times['setup_s']:.1f} s, one batch of 64 x 5 rewards "
              f"{times['batch_s']:.2f} s, every image once {times['every_image_s']:.1f} s; reward store "
              f"{times['store_after_setup_gb']:.2f} GB after set-up, {times['store_after_epoch_gb']:.2f} GB after "
              f"every image; process {wall:.1f} s, peak {peak:.2f} GB", flush=True)
    growth = math.log(SIZES["full"] / SIZES["10k"])
    print(f"growth 10k -> full: set-up x^{math.log(rows['full'][0] / rows['10k'][0]) / growth:.2f}, "
          f"memory x^{math.log(rows['full'][1] / rows['10k'][1]) / growth:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("write", "prepare", "scst", "scst-child"))
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage == "write":
        for label, images in SIZES.items():
            start = time.perf_counter()
            write(args.root / label, images)
            print(f"{label}: {images:,} images in {time.perf_counter() - start:.0f} s", flush=True)
    elif args.stage == "prepare":
        prepare(args.root)
    elif args.stage == "scst":
        scst(args.root)
    else:
        scst_child(args.root, args.out)


if __name__ == "__main__":
    main()
