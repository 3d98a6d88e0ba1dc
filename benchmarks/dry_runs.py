"""How long `train.py --dry-run` takes for every COCO config, as a user starting out would run it.

    python benchmarks/dry_runs.py [--configs coco_vgg19_soft,...] [--amp both|config|off] [--keep DIR]

Made here, in a temporary folder: a COCO of 40 images (640x480 JPEGs, the Karpathy split file:
30 train, 5 val, 5 test, five captions each) and a random weights file for each encoder the configs
name (VGG-19, ResNet-101), handed over as `encoder.weights_path`, the offline path. A config that
warm-starts (train.init_from: the fine-tuning and self-critical recipes) is given a checkpoint of
its first stage, made beforehand by one real step of that stage (not timed). Each dry run is timed
as a whole process (python start-up, imports, model building, the run itself), with train.amp as
the config sets it and/or off (what a CPU without bf16 instructions runs); the table gives the
seconds, the precision the run chose, and the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("coco_vgg19_soft", "coco_vgg19_hard", "coco_vgg19_finetune", "coco_vgg19_scst", "coco_resnet101_soft",
           "coco_resnet101_hard", "coco_resnet101_finetune")
WORDS = ("a", "man", "woman", "dog", "cat", "red", "blue", "sits", "stands", "on", "the", "table", "grass", "street",
         "next", "to", "with", "large", "small")


def make_coco(root: Path, *, images: int = 40, seed: int = 0) -> None:
    """ROOT/dataset_coco.json and ROOT/{train2014,val2014}/*.jpg: 3/4 train, then val and test."""
    rng = np.random.default_rng(seed)
    entries = []
    for i in range(images):
        split = "train" if i < images * 3 // 4 else ("val" if i < images * 7 // 8 else "test")
        folder = "train2014" if split == "train" else "val2014"
        name = f"COCO_{folder}_{i:012d}.jpg"
        (root / folder).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(60, 80, 3), dtype=np.uint8)
        Image.fromarray(pixels).resize((640, 480)).save(root / folder / name, quality=90)
        captions = [" ".join(rng.choice(WORDS, size=int(rng.integers(8, 14)))) for _ in range(5)]
        entries.append({"filepath": folder, "filename": name, "cocoid": i, "split": split,
                        "sentences": [{"raw": caption} for caption in captions]})
    (root / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": entries}))


def random_weights(name: str, folder: Path) -> Path:
    """A torchvision state dict of random weights for encoder `name` (what a local weights file holds)."""
    import torch
    import torchvision

    path = folder / f"{name}_random.pth"
    if not path.exists():
        torch.save(getattr(torchvision.models, name)(weights=None).state_dict(), path)
    return path


def train(args: list[str], cwd: Path) -> tuple[float, str, str]:
    """Run train.py with `args`; (seconds, the precision line or "", the last line of stdout)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CAPTIONING_QUIET": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "train.py"), "--device", "cpu", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"train.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    precision = next((line for line in done.stderr.splitlines() if line.startswith("precision:")), "")
    return seconds, precision, done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--amp", choices=("both", "config", "off"), default="both")
    parser.add_argument("--keep", help="make the data and weights here and keep them (default: a temporary folder)")
    args = parser.parse_args()
    from captioning.config import load_config
    from captioning.runtime.precision import cpu_has_native_bf16

    folder = Path(args.keep or tempfile.mkdtemp(prefix="captioning-dry-runs-"))
    coco = folder / "coco"
    if not (coco / "dataset_coco.json").exists():
        make_coco(coco)
    print(f"# {os.cpu_count()} cores, bf16 instructions: {'yes' if cpu_has_native_bf16() else 'no'}; "
          f"40-image COCO and random weights in {folder}")
    print("| config | train.amp | seconds | precision | result |")
    print("|---|---|---|---|---|")
    for name in args.configs.split(","):
        path = REPO / "configs" / f"{name}.yaml"
        config = load_config(path)
        common = [f"data.root={coco}", f"encoder.weights_path={random_weights(config.encoder.name, folder)}"]
        if config.train.init_from:  # its first stage's checkpoint: one real step of that stage, on the fly
            first = folder / "first" / name
            first_config = REPO / "configs" / f"{Path(config.train.init_from).parent.name}.yaml"
            if not (first / "best.pt").exists():
                train(["--config", str(first_config), *common, f"train.out_dir={first}", "train.max_steps=1",
                       "data.max_images=8", "data.feature_cache=false", "train.val_images=2", "train.batch_size=4",
                       "train.amp=false"], cwd=folder)
            common.append(f"train.init_from={first / 'best.pt'}")
        amps = {"both": ((config.train.amp, "config"), (False, "off")), "config": ((config.train.amp, "config"),),
                "off": ((False, "off"),)}[args.amp]
        for amp, _ in amps:
            seconds, precision, result = train(["--config", str(path), "--dry-run", *common,
                                                f"train.amp={str(amp).lower()}"], cwd=folder)
            chosen = precision.removeprefix("precision: ") or "float32"
            print(f"| {name} | {str(amp).lower()} | {seconds:.1f} | {chosen} | {result} |", flush=True)


if __name__ == "__main__":
    main()
