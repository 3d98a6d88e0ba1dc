"""Hard attention over seeds: how often does it learn to look at the objects, and does bringing the
REINFORCE terms in gradually (train.reinforce.weight_warmup) change that?

    python -m studies.hard_seeds.run                  # train what is missing, then rewrite the table
    python -m studies.hard_seeds.run --tables-only

The setting of tests/train/test_learning.py: shapes data of 600 / 60 / 100 images (seed 7),
configs/shapes_hard.yaml for 5 epochs (235 batches) with the coin's warm-up over the first 100, one
CPU thread, seeds 7 to 11; each variant with and without the REINFORCE terms' warm-up over the first
200 batches. Scored on the 100 test images, greedy, with the chosen cell (argmax). Results are kept
per run in RESULTS/<name>.json (default studies/hard_seeds/results/, committed); checkpoints in OUT/<name>/; a
run whose OUT/<name>/best.pt exists is scored without training again.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
from captioning.config import load_config
from captioning.data.shapes.scenes import make_shapes
from captioning.data.splits import load_splits
from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import evaluate_split, scorer_for
from captioning.train.loop import fit
from studies.tables import REPO, study_parser, write_between

COUNTS, DATA_SEED = {"train": 600, "val": 60, "test": 100}, 7
BASE = ("train.epochs=5", "train.val_images=60", "model.hard.warmup=100")
SEEDS = range(7, 12)
VARIANTS = {"coin warm-up only": (),
            "+ REINFORCE warm-up 200 (as shapes_hard.yaml)": ("train.reinforce.weight_warmup=200",)}


def name_of(variant: str, seed: int) -> str:
    return f"{'reinforce_warmup' if VARIANTS[variant] else 'coin_warmup'}_seed{seed}"


def run(variant: str, seed: int, *, data: Path, out: Path, results: Path) -> dict:
    name = name_of(variant, seed)
    path = results / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    config = load_config(REPO / "configs" / "shapes_hard.yaml", [f"data.root={data}", f"train.out_dir={out / name}",
                                                                 *BASE, f"train.seed={seed}", *VARIANTS[variant]])
    if not (out / name / "best.pt").exists():
        fit(config, resume=(out / name / "last.pt").exists())  # a run stopped before its first best goes on
    payload = load_checkpoint(out / name / "best.pt")
    test = load_splits(config, ("test",))["test"]
    vocab = Vocabulary(payload["vocab"])
    metrics, _ = evaluate_split(decoder_from_checkpoint(payload, config), test.annotations, image_ids=test.image_ids,
                                references=test.references, vocab=vocab, grid=test.grid, scorer=scorer_for(test, vocab),
                                beam_size=1, full=False, hard_choice="argmax")
    result = {"name": name, "seed": seed, "overrides": [*BASE, *VARIANTS[variant]], **metrics,
              "ratio": metrics["attention_correctness"] / metrics["attention_correctness_chance"]}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def table(results: dict[tuple[str, int], dict]) -> str:
    lines = ["| variant | " + " | ".join(f"seed {s}" for s in SEEDS) + " | median |",
             "|---|" + "---|" * (len(SEEDS) + 1)]
    for variant in VARIANTS:
        done = [results[(variant, s)] for s in SEEDS if (variant, s) in results]
        cells = [f"{r['ratio']:.2f}x (CIDEr {r['CIDEr']:.2f})" for r in done]
        median = f"{statistics.median(r['ratio'] for r in done):.2f}x" if done else "–"
        lines.append(f"| {variant} | " + " | ".join(cells + ["–"] * (len(SEEDS) - len(cells))) + f" | {median} |")
    return "\n".join(lines)


def main() -> int:
    args = study_parser(__doc__, data="data/hard_seeds", out="runs/hard_seeds", results="studies/hard_seeds/results",
                        data_help=f"shapes data (made if missing: {COUNTS})",
                        table_doc="studies/hard_seeds/README.md").parse_args()
    torch.set_num_threads(1)
    data, out, kept = Path(args.data), Path(args.out), Path(args.results)
    results = {}
    for variant in VARIANTS:
        for seed in SEEDS:
            if args.tables_only or (args.only and args.only not in name_of(variant, seed)):
                path = kept / f"{name_of(variant, seed)}.json"
                if path.exists():
                    results[(variant, seed)] = json.loads(path.read_text())
                continue
            if not (data / "dataset_shapes.json").exists():
                make_shapes(data, COUNTS, seed=DATA_SEED)
            results[(variant, seed)] = run(variant, seed, data=data, out=out, results=kept)
            print(variant, seed, f"{results[(variant, seed)]['ratio']:.2f}x", flush=True)
    write_between(Path(args.doc), "hard-seeds", "python -m studies.hard_seeds.run", table(results))
    print(f"table written to {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
