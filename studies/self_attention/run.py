"""Self-attention on the embedded default: the paper's soft attention, + self-attention over the words
said so far, + over the grid, + both; three seeds each at the same budget.

    python -m studies.self_attention.run                  # train what is missing, time the steps, rewrite the tables
    python -m studies.self_attention.run --tables-only    # rewrite the tables from the kept results

The attention table's data (shapes, 1 500 / 150 / 300 images, seed 0) and base
(configs/shapes_soft.yaml), two epochs (236 steps) a run on one CPU thread, seeds 0 to 2. Each
best checkpoint is scored on the 300 test images, greedy: BLEU-4 and CIDEr (the project's
tokenization), attention correctness against its chance, the relations the captions state and the
relation probe (eval/shapes). Results are kept per run in RESULTS/<name>.json (committed);
checkpoints in OUT/<name>/.

The cost per step is measured apart, all four variants in one process, interleaved: a training
step (forward, backward, Adam) on the same 64 training captions, median of 15 after 3 warm-ups, one
thread; it is kept in RESULTS/cost.json with the processor's name, and measured again only when
that file is removed.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import statistics
import time
from pathlib import Path

import torch

from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
from captioning.config import load_config
from captioning.data.shapes.scenes import make_shapes
from captioning.data.splits import load_splits
from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import evaluate_split, scorer_for
from captioning.model.encoder_decoder import build_decoder
from captioning.train.loop import fit
from studies.tables import REPO, study_parser, write_between

COUNTS = {"train": 1500, "val": 150, "test": 300}  # as the attention table's study: the same data/study folder
BASE = ("configs/shapes_soft.yaml", "train.epochs=2", "train.val_images=100", "train.early_stop_patience=10")
SEEDS = (0, 1, 2)
VARIANTS = {
    "soft (the paper's)": (),
    "+ words": ("model.extras.word_attention=true",),
    "+ grid": ("model.extras.grid_attention=4",),
    "+ both": ("model.extras.word_attention=true", "model.extras.grid_attention=4"),
}
SHORT = {"soft (the paper's)": "soft", "+ words": "words", "+ grid": "grid", "+ both": "both"}


def name_of(variant: str, seed: int) -> str:
    return f"{SHORT[variant]}_seed{seed}"


def config_of(variant: str, seed: int, *, data: Path, out: Path):
    return load_config(REPO / BASE[0], [*BASE[1:], f"data.root={data}", f"train.out_dir={out / name_of(variant, seed)}",
                                        f"train.seed={seed}", *VARIANTS[variant]])


def run(variant: str, seed: int, *, data: Path, out: Path, results: Path) -> dict:
    """Train one variant and seed (unless done) and score its best checkpoint on the test split."""
    name = name_of(variant, seed)
    path = results / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    config = config_of(variant, seed, data=data, out=out)
    shutil.rmtree(out / name, ignore_errors=True)  # a run stopped before its result was kept: again, whole, so that
    started = time.time()                          # its time is one run's (a new run refuses a folder that holds one)
    summary = fit(config)
    seconds = time.time() - started
    payload = load_checkpoint(out / name / "best.pt")
    test = load_splits(config, ("test",))["test"]
    vocab = Vocabulary(payload["vocab"])
    metrics, _ = evaluate_split(decoder_from_checkpoint(payload, config), test.annotations, image_ids=test.image_ids,
                                references=test.references, vocab=vocab, grid=test.grid,
                                scorer=scorer_for(test, vocab), beam_size=1, full=False)
    result = {"name": name, "variant": variant, "seed": seed, "overrides": list(VARIANTS[variant]),
              "steps": summary["steps"], "train_seconds": seconds,
              "best_epoch": payload["progress"]["history"][-1]["epoch"], **metrics}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def step_costs(*, data: Path, out: Path, results: Path, repeats: int = 15) -> dict:
    """Seconds per training step of each variant (random weights), interleaved in this process."""
    path = results / "cost.json"
    if path.exists():
        return json.loads(path.read_text())
    config = config_of("soft (the paper's)", 0, data=data, out=out)
    train = load_splits(config, ("train",))["train"]
    vocab_size = len(Vocabulary.load(out / name_of("soft (the paper's)", 0) / "vocab.json"))  # after the runs
    generator = torch.Generator().manual_seed(0)
    annotations = torch.from_numpy(train.annotations[:64].astype("float32"))  # [64, L, D]
    tokens = torch.randint(4, vocab_size, (64, 12), generator=generator)  # shapes captions are about 9 words
    models = {}
    for variant in VARIANTS:
        model_config = config_of(variant, 0, data=data, out=out).model
        torch.manual_seed(0)
        decoder = build_decoder(model_config, vocab_size=vocab_size, annotation_dim=annotations.shape[2],
                                grid=train.grid).train()
        models[variant] = (decoder, torch.optim.Adam(decoder.parameters(), lr=1e-3))
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for attempt in range(3 + repeats):
        for variant, (decoder, optimizer) in models.items():
            started = time.perf_counter()
            output = decoder(annotations, tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(output.logits.flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if attempt >= 3:
                times[variant].append(time.perf_counter() - started)
    cost = {"processor": _processor(), "threads": torch.get_num_threads(),
            "seconds": {variant: statistics.median(values) for variant, values in times.items()}}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cost, indent=2))
    return cost


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _spread(values: list[float], digits: int = 3) -> str:
    """mean ± standard deviation over the seeds (– where none is a number)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(results: dict[tuple[str, int], dict], cost: dict | None) -> str:
    lines = ["| variant | seeds | BLEU-4 | CIDEr | attention correctness | ratio to chance | relations stated: "
             "accuracy (n) | relation probe | step, ms | × soft |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    soft_cost = cost["seconds"]["soft (the paper's)"] if cost else None
    for variant in VARIANTS:
        done = [results[(variant, s)] for s in SEEDS if (variant, s) in results]
        if not done:
            continue
        stated = sum(r["relations_generated"] for r in done)
        right = sum(r["relation_accuracy"] * r["relations_generated"] for r in done if r["relations_generated"])
        relations = f"{right / stated:.2f} ({stated})" if stated else "– (0)"
        seconds = cost["seconds"][variant] if cost else None
        step = f"{seconds * 1000:.0f} | {seconds / soft_cost:.2f}" if cost else "– | –"
        lines.append(
            f"| {variant} | {len(done)} | {_spread([r['Bleu_4'] for r in done])} | "
            f"{_spread([r['CIDEr'] for r in done])} "
            f"| {_spread([r['attention_correctness'] for r in done])} | "
            f"{_spread([r['attention_correctness'] / r['attention_correctness_chance'] for r in done], 2)}x | "
            f"{relations} | {_spread([r['relation_probe_accuracy'] for r in done])} | {step} |")
    lines += ["", "Per seed (BLEU-4 / CIDEr / attention ratio to chance):", ""]
    lines += ["| variant | " + " | ".join(f"seed {s}" for s in SEEDS) + " |", "|---|" + "---|" * len(SEEDS)]
    for variant in VARIANTS:
        cells = []
        for seed in SEEDS:
            r = results.get((variant, seed))
            cells.append("–" if r is None else f"{r['Bleu_4']:.3f} / {r['CIDEr']:.2f} / "
                         f"{r['attention_correctness'] / r['attention_correctness_chance']:.2f}x")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    if cost:
        lines += ["", f"Step cost: {cost['processor']}, {cost['threads']} thread, 64 captions of 11 words, median of "
                  "15 interleaved steps in one process."]
    return "\n".join(lines)


def main() -> int:
    args = study_parser(__doc__, data="data/study", out="runs/self_attention", results="studies/self_attention/results",
                        data_help=f"shapes data (made if missing: {COUNTS})",
                        table_doc="studies/self_attention/README.md").parse_args()
    torch.set_num_threads(1)  # the same budget for every run: one CPU thread
    data, out, kept = Path(args.data), Path(args.out), Path(args.results)
    results = {}
    for variant in VARIANTS:
        for seed in SEEDS:
            name = name_of(variant, seed)
            if args.tables_only or (args.only and args.only not in name):
                if (kept / f"{name}.json").exists():
                    results[(variant, seed)] = json.loads((kept / f"{name}.json").read_text())
                continue
            if not (data / "dataset_shapes.json").exists():
                make_shapes(data, COUNTS, seed=0)
            results[(variant, seed)] = run(variant, seed, data=data, out=out, results=kept)
            r = results[(variant, seed)]
            print(f"{name}: BLEU-4 {r['Bleu_4']:.3f}, CIDEr {r['CIDEr']:.2f}, attention "
                  f"{r['attention_correctness'] / r['attention_correctness_chance']:.2f}x, "
                  f"{r['train_seconds']:.0f} s", flush=True)
    cost = None
    if (kept / "cost.json").exists() or not args.tables_only:
        cost = step_costs(data=data, out=out, results=kept)
    write_between(Path(args.doc), "self-attention", "python -m studies.self_attention.run", table(results, cost))
    print(f"table written to {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
