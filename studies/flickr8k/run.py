"""Flickr8k on a 2-core CPU: what gets Show, Attend and Tell to the paper's Table 1 row, measured.

    python -m studies.flickr8k.run --data ../shared/flickr8k --cache /tmp/flickr8k   # what has no kept result
    python -m studies.flickr8k.run --data ../shared/flickr8k --cache /tmp/flickr8k --only features
    python -m studies.flickr8k.run --tables-only

Every run is configs/flickr8k_soft.yaml (or flickr8k_hard.yaml, flickr8k_scst.yaml) with a few
overrides, trained through the package's own `fit` on Karpathy's train split and scored on its val
split as `eval.py --split val` scores it (beam 3 unless the run says otherwise; pycocoevalcap with
Java). The test split is held out: nothing here reads it. The data folder is only read; the feature
caches and tokens go to --cache (data.cache_root). Each run's numbers are kept in
RESULTS/<name>.json (committed), with its training time and the validation curve; a run whose
result is kept is not trained again, and one whose best.pt is under --out is scored without
training. --threads sets torch's threads, so that two runs can share the two cores.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import torch

from captioning.checkpoint import load_checkpoint
from captioning.config import load_config
from captioning.eval.evaluate import evaluate_checkpoint
from captioning.train.loop import fit
from captioning.train.validation import validation_beam, validation_tokenizer
from studies.flickr8k.languages import same_photos_english
from studies.flickr8k.runs import ABLATION_EPOCHS, FIRST_SHIPPED, METRICS, RUNS, SAME_PHOTOS_ENGLISH, Run
from studies.flickr8k.tables import (
    ablation_table,
    decoding_table,
    language_table,
    paper_table,
    scst_table,
    spread,
    table,
    train_split_table,
)
from studies.tables import REPO, study_parser, write_between

CONFIGS = REPO / "configs"
FIRST_SHIPPED_COMMIT = "5807b26"  # the last commit whose package shipped the first model
PAIR_SHIPPED_COMMIT = "46a9a97"  # the last commit whose package shipped the pair (seed 0, seed 1 after SCST)


def overrides_of(run: Run, *, data: Path, cache: Path, out: Path, name: str) -> list[str]:
    common = [f"data.root={data}", f"data.cache_root={cache}", f"train.out_dir={out / name}"]
    start = [f"train.init_from={out / run.start / 'best.pt'}"] if run.start else []  # a run trained from another
    epochs = [f"train.epochs={ABLATION_EPOCHS}"] if run.ablation else []
    return [*common, *start, *(o.replace("{cache}", str(cache)) for o in run.overrides), *epochs]


def first_shipped(out: Path) -> Path:
    """The model the package shipped first (runs.FIRST_SHIPPED), as it shipped: its file from the
    repository's history, written once under --out."""
    return shipped_at(FIRST_SHIPPED_COMMIT, out / f"{FIRST_SHIPPED}.pt")


def shipped_at(commit: str, path: Path) -> Path:
    """The package's shipped file as it was at `commit`, from the repository's history, written once
    to `path` (a model the package no longer ships, whose kept numbers are that file's)."""
    if not path.exists():
        shown = subprocess.run(["git", "show", f"{commit}:captioning/pretrained/flickr8k_soft.pt"],
                               cwd=REPO, capture_output=True, check=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(shown.stdout)
    return path


def curve(run_dir: Path) -> list[dict]:
    """The validation metrics after each evaluation (greedy, the package's own tokenizer), from the
    run's log.jsonl."""
    path = run_dir / "log.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"step": row["step"], "epoch": row["epoch"], **row["validation"]} for row in rows if "validation" in row]


def run(name: str, spec: Run, *, data: Path, cache: Path, out: Path, results: Path) -> dict:
    path = results / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    trained, began = {}, time.time()
    if spec.group == "language":  # the English captions of the photos with German ones, under --cache
        same_photos_english(data, cache / SAME_PHOTOS_ENGLISH)
    if spec.members:  # several runs' models decoded together: the first one's config
        checkpoint = [first_shipped(out) if m == FIRST_SHIPPED else out / m / "best.pt" for m in spec.members]
    elif spec.start == FIRST_SHIPPED:  # the model the package shipped first, decoded otherwise
        checkpoint = first_shipped(out)
    elif spec.group == "beam" or spec.split != "val" or (spec.start and spec.decode):
        # a run's model, decoded otherwise or on other images
        checkpoint = out / spec.start / "best.pt"
    else:
        overrides = overrides_of(spec, data=data, cache=cache, out=out, name=name)
        checkpoint = out / name / "best.pt"
        if not checkpoint.exists() or not (out / name / ".finished").exists():
            config = load_config(CONFIGS / spec.config, overrides)
            summary = fit(config, resume=(out / name / "last.pt").exists())
            if summary["interrupted"]:  # stopped by a signal: --resume goes on from last.pt next time
                raise SystemExit(f"{name}: stopped by {summary['interrupted']}; run it again to go on")
            # fit's clock goes on across resumes: the time trained in all, however often it was stopped
            # and the time from the images to the numbers, the feature cache included where this run built it
            trained = {"train_seconds": round(summary["seconds"], 1), "steps": summary["steps"],
                       "wall_seconds_to_trained": round(time.time() - began, 1)}
            (out / name / ".finished").write_text(json.dumps(trained))
        trained = json.loads((out / name / ".finished").read_text())
    started = time.time()
    evaluation = evaluate_checkpoint(checkpoint, split=spec.split, beam_size=spec.beam_size,
                                     overrides=[f"data.root={data}", f"data.cache_root={cache}", *spec.decode])
    result = {"name": name, "group": spec.group, "label": spec.label, "config": spec.config,
              "overrides": list(spec.overrides), "decode": list(spec.decode),
              "split": spec.split, "beam_size": evaluation.beam_size, "tokenizer": evaluation.tokenizer,
              **{k: v for k, v in evaluation.metrics.items() if isinstance(v, (int, float))},
              "images": len(evaluation.results), "language": evaluation.config.data.language,
              "vocabulary": None if spec.members else len(load_checkpoint(checkpoint)["vocab"]),
              "decode_seconds": round(time.time() - started, 1), **trained,
              "curve": curve(out / name) if trained else [],
              "validated_with": (f"beam {validation_beam(evaluation.config)}, {validation_tokenizer(evaluation.config)}"
                                 if trained else None),
              "torch_threads": torch.get_num_threads()}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def main() -> int:
    parser = study_parser(__doc__, data="../shared/flickr8k", out="runs/flickr8k", results="studies/flickr8k/results",
                          data_help="Flickr8k: dataset_flickr8k.json and Flicker8k_Dataset/ (read only)",
                          table_doc="studies/flickr8k/README.md")
    parser.add_argument("--cache", default="data/flickr8k_cache", help="data.cache_root: the feature caches")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--results-doc", default="docs/results.md", help="where the table beside the paper goes")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data, cache, out, kept = Path(args.data), Path(args.cache), Path(args.out), Path(args.results)
    results = {}
    for name, spec in RUNS.items():
        chosen = args.only is None or args.only in (name, spec.group)
        if args.tables_only or not chosen:
            if (kept / f"{name}.json").exists():
                results[name] = json.loads((kept / f"{name}.json").read_text())
            continue
        results[name] = run(name, spec, data=data, cache=cache, out=out, results=kept)
        print(name, " ".join(f"{m} {results[name][m]:.3f}" for m in METRICS if m in results[name]), flush=True)
    doc, command = Path(args.doc), "python -m studies.flickr8k.run --tables-only"
    for group in ("features", "model"):
        write_between(doc, f"flickr8k-{group}", command, ablation_table(results, group))
    write_between(doc, "flickr8k-language", command, language_table(results))
    for group in ("beam", "seeds", "scst", "side", "hard_budget", "hard_finetune", "ensemble", "stronger"):
        write_between(doc, f"flickr8k-{group}", command, table(results, group))
    write_between(doc, "flickr8k-spread", command, spread(results))
    write_between(doc, "flickr8k-decoding", command, decoding_table(results))
    write_between(doc, "flickr8k-scst-budget", command, scst_table(results))
    write_between(doc, "flickr8k-train-split", command, train_split_table(results))
    if args.results_doc:
        write_between(Path(args.results_doc), "flickr8k-paper", command, paper_table(results))
    print(f"tables written to {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
