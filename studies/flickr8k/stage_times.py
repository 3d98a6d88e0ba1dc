"""A Flickr8k recipe from the images to the val numbers, one stage at a time, each its own command as
a user types it, timed from outside:

    python -m studies.flickr8k.stage_times --data /data/flickr8k --cache /tmp/timing --out /tmp/timing_run
    python -m studies.flickr8k.stage_times --recipe best --data /data/flickr8k --cache /tmp/best --out /tmp/best_run

`soft` is configs/flickr8k_soft.yaml; `best` is what the package ships: three seeds of the soft
recipe at 10 epochs and dropout 0.3 (0, 1 and 3), seed 1 then trained self-critically, seed 0
fine-tuned with Lite2 from block5, and seed 3, seed 1's self-critical model and seed 0's fine-tuned
one decoded together (studies/flickr8k, "A stronger captioner").
--cache and --out must start empty (the stages are timed from nothing).
Each stage's seconds are written to results/stage_times.json (stage_times_best.json) as it ends,
with the machine's CPU and its load average (the last minute's) before and after, and a stage
already timed there is skipped on the next call (--again times all anew): a stopped timing goes on
from the stage it stopped in, which starts again. The numbers go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from studies.tables import REPO, write_between

CONFIG = "configs/flickr8k_soft.yaml"
# The seeds of the best recipe: the soft recipe at the side-by-side budget, one seed each.
MEMBER = ("train.epochs=10", "model.dropout=0.3")
# Self-critical training of the second, as the study kept it (flickr8k_scst.yaml's 240 steps at 5e-5,
# greedy baseline, the member's dropout, validated every 60 steps).
SCST = ("model.dropout=0.3", "train.eval_every_steps=60")
# Fine-tuning of the first with Lite2 from block5, as the study kept it (flickr8k_finetune.yaml's 4
# epochs; the frozen stages' output cached once, in the stage's own time).
FINE_TUNE = ("model.dropout=0.3", "encoder.fine_tune_from=block5")
# Seed 0 starts the fine-tuning and seed 1 the self-critical training; seed 3 decodes beside them as
# it is (a third start: seed 0's frozen decoder would share the fine-tuned one's).
SEEDS = (0, 1, 3)


def _stages(*, data: str, cache: str, out: str, recipe: str = "soft") -> dict[str, list[str]]:
    """Each stage's command (what a user runs), in order."""
    where = [f"data.root={data}", f"data.cache_root={cache}"]
    stages = {
        # the vocabulary of the training captions and every split's captions tokenized once
        "prepare": [_captioning(), "prepare", "--quiet", "--config", CONFIG, *where, f"train.out_dir={out}"],
        # EfficientNet-Lite2's frozen annotations of the train and val photos, cached in fp16
        "encode": [_captioning(), "prepare-features", "--quiet", "--config", CONFIG, *where, f"train.out_dir={out}"],
    }
    scored = ["--split", "val", *where, "--out", f"{out}/val_metrics.json"]
    if recipe == "soft":
        # the recipe's epochs, validated after each as eval.py reports
        stages["train"] = [sys.executable, "train.py", "--quiet", "--config", CONFIG, *where, f"train.out_dir={out}"]
        # the kept checkpoint's captions of the 1 000 val photos, scored with pycocoevalcap
        stages["evaluate"] = [sys.executable, "eval.py", "--quiet", "--checkpoint", f"{out}/best.pt", *scored]
        return stages
    for seed in SEEDS:
        stages[f"train_seed{seed}"] = [sys.executable, "train.py", "--quiet", "--config", CONFIG, *MEMBER,
                                       f"train.seed={seed}", *where, f"train.out_dir={out}/seed{seed}"]
    stages["scst_seed1"] = [sys.executable, "train.py", "--quiet", "--config", "configs/flickr8k_scst.yaml", *SCST,
                            f"train.init_from={out}/seed1/best.pt", *where, f"train.out_dir={out}/scst1"]
    stages["finetune_seed0"] = [sys.executable, "train.py", "--quiet", "--config", "configs/flickr8k_finetune.yaml",
                                *FINE_TUNE, f"train.init_from={out}/seed0/best.pt", *where,
                                f"train.out_dir={out}/finetune0"]
    stages["evaluate_trio"] = [sys.executable, "eval.py", "--quiet", "--checkpoint", f"{out}/seed3/best.pt",
                               "--checkpoint", f"{out}/scst1/best.pt", "--checkpoint", f"{out}/finetune0/best.pt",
                               *scored]
    return stages


WHAT = {"prepare": "the vocabulary and the captions tokenized",
        "encode": "EfficientNet-Lite2's annotations of the 7 000 train and val photos, cached",
        "train": "the recipe's training, validated after each epoch",
        "evaluate": "the kept checkpoint's captions of the 1 000 val photos, scored",
        **{f"train_seed{seed}": f"seed {seed}: 10 epochs at dropout 0.3, validated after each" for seed in SEEDS},
        "scst_seed1": "seed 1's best.pt trained self-critically, 240 steps, validated every 60",
        "finetune_seed0": "seed 0's best.pt fine-tuned with Lite2 from block5, 4 epochs (block4's output "
                          "cached first)",
        "evaluate_trio": "seed 3's best.pt, seed 1's self-critical one and seed 0's fine-tuned one decoding "
                         "the 1 000 val photos together (encoded on the fly), scored"}


def table(kept: dict) -> str:
    """The stages as docs/benchmarks.md shows them."""
    lines = ["| stage | command | minutes | load average before, after |", "|---|---|---|---|"]
    for name in sorted(kept["stages"], key=list(WHAT).index):  # in the recipe's order, however they were timed
        stage = kept["stages"][name]
        lines.append(f"| {WHAT[name]} | `{stage['command']}` | {stage['seconds'] / 60:.1f} | "
                     f"{stage['load_before']}, {stage['load_after']} |")
    total = sum(stage["seconds"] for stage in kept["stages"].values())
    lines.append(f"| in all | | {total / 60:.1f} | |")
    cpus = ", ".join(sorted({stage.get("cpu", "?") for stage in kept["stages"].values()}))
    lines += ["", f"On {cpus}."]
    if "val" in kept:
        val = kept["val"]
        what = "The three checkpoints together" if "evaluate_trio" in kept["stages"] else "The checkpoint kept"
        # the kept four digits as they are: rounding them again to three would round twice
        lines[-1] += (f" {what} scored BLEU-4 {val['Bleu_4']:.4f}, METEOR {val['METEOR']:.4f}, "
                      f"CIDEr {val['CIDEr']:.4f} on val.")
    return "\n".join(lines)


def _captioning() -> str:
    """The `captioning` command installed beside this Python."""
    return str(Path(sys.executable).with_name("captioning"))


def _cpu() -> str:
    model = family = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("cpu family"):  # 23: Zen 1-2, 25: Zen 3-4, 26: Zen 5 (AMD)
                family = line.split(":", 1)[1].strip()
        return f"{model}, CPU family {family} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="Flickr8k: dataset_flickr8k.json and Flicker8k_Dataset/")
    parser.add_argument("--cache", required=True, help="data.cache_root for this timing (start it empty)")
    parser.add_argument("--out", required=True, help="train.out_dir for this timing (start it empty)")
    parser.add_argument("--recipe", choices=("soft", "best"), default="soft", help="which recipe (default: soft)")
    parser.add_argument("--again", action="store_true", help="time every stage anew")
    parser.add_argument("--results", type=Path, help="where the times are kept (default: studies/flickr8k/results/"
                        "stage_times.json, or stage_times_best.json)")
    args = parser.parse_args()
    suffix = "" if args.recipe == "soft" else f"_{args.recipe}"
    args.results = args.results or REPO / f"studies/flickr8k/results/stage_times{suffix}.json"
    kept = {} if args.again or not args.results.exists() else json.loads(args.results.read_text())
    stages = kept.setdefault("stages", {})
    for name, command in _stages(data=args.data, cache=args.cache, out=args.out, recipe=args.recipe).items():
        if name in stages:
            print(f"{name}: {stages[name]['seconds'] / 60:.1f} min (kept)")
            continue
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        subprocess.run(command, cwd=REPO, check=True)
        seconds = time.perf_counter() - started
        typed = " ".join([Path(command[0]).name, *command[1:]])
        # the longest first: an --out that begins with --cache's path stays OUT
        for path, name_of_it in sorted(((args.data, "DATA"), (args.cache, "CACHE"), (args.out, "OUT")),
                                       key=lambda pair: -len(pair[0])):
            typed = typed.replace(path, name_of_it)
        stages[name] = {"command": typed,
                        "seconds": round(seconds, 1), "cpu": _cpu(), "load_before": round(load_before, 2),
                        "load_after": round(os.getloadavg()[0], 2)}
        args.results.write_text(json.dumps(kept, indent=2) + "\n")  # kept as each stage ends
        print(f"{name}: {seconds / 60:.1f} min")
    scored = Path(args.out) / "val_metrics.json"  # the evaluate stage's numbers, kept beside its time
    if scored.exists():
        metrics = json.loads(scored.read_text())
        kept["val"] = {name: round(metrics[name], 4) for name in ("Bleu_4", "METEOR", "CIDEr")}
        args.results.write_text(json.dumps(kept, indent=2) + "\n")
    total = sum(stage["seconds"] for stage in stages.values())
    print(f"in all: {total / 60:.1f} min on {', '.join(sorted({stage.get('cpu', '?') for stage in stages.values()}))}")
    recipe = "" if args.recipe == "soft" else f" --recipe {args.recipe}"
    write_between(REPO / "docs/benchmarks.md", f"flickr8k{suffix.replace('_', '-')}-stages",
                  f"python -m studies.flickr8k.stage_times{recipe} --data DATA --cache CACHE --out OUT", table(kept))


if __name__ == "__main__":
    main()
