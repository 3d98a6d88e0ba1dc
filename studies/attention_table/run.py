"""Every attention score x {soft, hard}, and the localization study, on the same shapes data and budget.

    python -m studies.attention_table.run                 # train what is missing, then rewrite the tables
    python -m studies.attention_table.run --only hard_    # just the runs whose name contains "hard_"
    python -m studies.attention_table.run --tables-only   # rewrite docs/results.md from finished runs

Each run trains from configs/shapes_soft.yaml plus its overrides, on one CPU thread, then decodes the
test split greedily and scores it (BLEU-4 and CIDEr on the project's tokenization, attention
correctness and its chance level, relation accuracy). Results are kept per run in
RESULTS/<name>.json (default studies/attention_table/results/, committed: a fresh clone can rewrite the tables
with --tables-only), so an interrupted study resumes; checkpoints go to OUT/<name>/. The tables between
the markers in docs/results.md are regenerated from those files only, never typed by hand.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
from captioning.config import load_config
from captioning.data.shapes.scenes import make_shapes
from captioning.data.splits import load_splits
from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import evaluate_split, scorer_for
from captioning.train.loop import fit
from studies.object_cells import object_cells
from studies.tables import REPO, study_parser, write_between

COUNTS = {"train": 1500, "val": 150, "test": 300}
BASE = ("configs/shapes_soft.yaml", "train.epochs=1", "train.val_images=100", "train.early_stop_patience=10")
SCORES = ("additive", "general", "dot", "scaled_dot", "cosine", "local", "location", "concat")
SCORE_STEPS = 60  # half an epoch (3,840 captions) per score run: what ~1 h of one CPU thread allows for 16 runs

# name -> overrides on top of BASE. The score table: every score with both kinds of attention, on
# the same budget of SCORE_STEPS optimizer steps; hard attention with both warm-ups: the coin over the
# first half, the REINFORCE terms over the whole budget (without them, hard attention learns to avoid
# the objects: see hard_1ep and hard_warmup in the study).
KINDS = {"soft": ("model.attention=soft",),
         "hard": ("model.attention=hard", f"model.hard.warmup={SCORE_STEPS // 2}",
                  f"train.reinforce.weight_warmup={SCORE_STEPS}")}
SCORE_RUNS = {f"{kind}_{score}": (*KINDS[kind], f"model.score={score}", f"train.max_steps={SCORE_STEPS}")
              for score in SCORES for kind in KINDS}
# The localization study: one epoch (118 steps) each, one change at a time from soft/additive
# (stride 16, 14x14, no doubly stochastic term, no position), plus hard attention's estimators.
STUDY_RUNS = {
    "soft_1ep": ("model.attention=soft",),
    # The noise floor: the same run with two other seeds (data order, dropout, initial weights).
    "soft_1ep_seed1": ("model.attention=soft", "train.seed=1"),
    "soft_1ep_seed2": ("model.attention=soft", "train.seed=2"),
    "soft_2ep": ("model.attention=soft", "train.epochs=2"),
    "soft_stride32": ("model.attention=soft", "encoder.layer=stride32"),
    # The backbone's border padding: zeros (as trained) mark where the border is; these do not.
    "soft_reflect": ("model.attention=soft", "encoder.padding=reflect"),
    "soft_replicate": ("model.attention=soft", "encoder.padding=replicate"),
    "soft_ds_one": ("model.attention=soft", "train.ds_lambda=1.0"),
    "soft_position": ("model.attention=soft", "model.extras.position=learned"),
    "soft_position_2ep": ("model.attention=soft", "model.extras.position=learned", "train.epochs=2"),
    "soft_unit": ("model.attention=soft", "model.extras.unit_annotations=true"),
    "soft_local_1ep": ("model.attention=soft", "model.score=local"),
    "soft_local_position": ("model.attention=soft", "model.score=local", "model.extras.position=learned"),
    "soft_coordinates": ("model.attention=soft", "model.extras.position=coordinates"),
    "soft_local_coordinates": ("model.attention=soft", "model.score=local", "model.extras.position=coordinates"),
    # The previous word in the query (model.query_word): the map for "square" after "a red" knows
    # "red" was said. Three seeds, as for soft_1ep.
    "soft_query_word": ("model.attention=soft", "model.extras.query_word=true"),
    "soft_query_word_seed1": ("model.attention=soft", "model.extras.query_word=true", "train.seed=1"),
    "soft_query_word_seed2": ("model.attention=soft", "model.extras.query_word=true", "train.seed=2"),
    "hard_1ep": ("model.attention=hard",),
    "hard_loo4": ("model.attention=hard", "train.reinforce.baseline=leave_one_out",
                  "train.reinforce.location_samples=4"),
    "hard_sample_only": ("model.attention=hard", "model.hard.expectation_prob=0.0"),
    "hard_unit": ("model.attention=hard", "model.extras.unit_annotations=true"),
    "hard_unit_loo4": ("model.attention=hard", "model.extras.unit_annotations=true",
                       "train.reinforce.baseline=leave_one_out", "train.reinforce.location_samples=4"),
    "hard_unit_lambda0.1": ("model.attention=hard", "model.extras.unit_annotations=true", "train.reinforce.weight=0.1"),
    "hard_warmup": ("model.attention=hard", "model.hard.warmup=59"),
    "hard_warmup_loo4": ("model.attention=hard", "model.hard.warmup=59", "train.reinforce.baseline=leave_one_out",
                         "train.reinforce.location_samples=4"),
    "hard_warmup_2ep": ("model.attention=hard", "model.hard.warmup=118", "train.epochs=2"),
    # The REINFORCE terms brought in over the epoch as well (train.reinforce.weight_warmup).
    "hard_warmups": ("model.attention=hard", "model.hard.warmup=59", "train.reinforce.weight_warmup=118"),
    "hard_warmups_loo4": ("model.attention=hard", "model.hard.warmup=59", "train.reinforce.weight_warmup=118",
                          "train.reinforce.baseline=leave_one_out", "train.reinforce.location_samples=4"),
    "hard_warmups_2ep": ("model.attention=hard", "model.hard.warmup=118", "train.reinforce.weight_warmup=236",
                         "train.epochs=2"),
}
RUNS = {**SCORE_RUNS, **STUDY_RUNS}
# The order in which a full study trains them: the comparisons the study is about first, so that a
# study cut short by its budget still answers them.
PRIORITY = ("soft_1ep", "hard_1ep", "soft_2ep", "soft_position", "soft_stride32", "hard_loo4", "soft_additive",
            "hard_sample_only", "hard_unit", "soft_ds_one", "hard_unit_loo4", "hard_unit_lambda0.1",
            "soft_position_2ep", "hard_warmup", "soft_unit")  # the order they were in fact run
ORDER = list(dict.fromkeys([*PRIORITY, *SCORE_RUNS, "soft_local_position", *STUDY_RUNS]))


def run(name: str, overrides: tuple[str, ...], *, data: Path, out: Path, results: Path) -> dict:
    """Train one configuration (unless already done) and score its best checkpoint on the test split."""
    result_path = results / f"{name}.json"
    if result_path.exists():
        return json.loads(result_path.read_text())
    config = load_config(REPO / BASE[0], [*BASE[1:], f"data.root={data}", f"train.out_dir={out / name}", *overrides])
    shutil.rmtree(out / name, ignore_errors=True)  # a run stopped before its result was kept: again, whole, so that
    started = time.time()                          # its time is one run's (a new run refuses a folder that holds one)
    summary = fit(config)
    seconds = time.time() - started
    payload = load_checkpoint(out / name / "best.pt")
    test = load_splits(config, ("test",))["test"]
    decoder = decoder_from_checkpoint(payload, config)
    result = {"name": name, "overrides": list(overrides), "train_seconds": seconds, "steps": summary["steps"],
              "best_epoch": payload["progress"]["history"][-1]["epoch"]}  # best.pt's history ends there
    choices = ("expectation", "argmax") if config.model.attention == "hard" else ("expectation",)
    for choice in choices:
        vocab = Vocabulary(payload["vocab"])
        metrics, _ = evaluate_split(decoder, test.annotations, image_ids=test.image_ids, references=test.references,
                                    vocab=vocab, grid=test.grid, scorer=scorer_for(test, vocab), beam_size=1,
                                    full=False, hard_choice=choice)
        result[choice] = metrics
    results.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=2))
    return result


def _row(name: str, result: dict) -> str:
    m = result["expectation"]
    ratio = m["attention_correctness"] / m["attention_correctness_chance"]
    argmax = result.get("argmax")
    hard = f"{argmax['CIDEr']:.3f} / {argmax['attention_correctness'] / argmax['attention_correctness_chance']:.2f}x" \
        if argmax else "–"
    relation = m["relation_accuracy"]
    return (f"| {name} | {m['Bleu_4']:.3f} | {m['CIDEr']:.3f} | {m['attention_correctness']:.3f} | "
            f"{m['attention_correctness_chance']:.3f} | **{ratio:.2f}x** | "
            f"{'–' if math.isnan(relation) else f'{relation:.2f}'} ({m['relations_generated']}) | "
            f"{m['relation_probe_accuracy']:.2f} | {hard} | {result['train_seconds']:.0f} |")


HEADER = ("| run | BLEU-4 | CIDEr | attention correctness | chance | ratio | relations stated: accuracy (n) | "
          "relation probe | argmax decoding: CIDEr / ratio | train s |\n|---|---|---|---|---|---|---|---|---|---|")


def tables(results: dict[str, dict]) -> str:
    done = lambda names: [n for n in names if n in results]  # noqa: E731
    lines = [f"### Every score, soft and hard ({SCORE_STEPS} steps each)", "", HEADER]
    lines += [_row(n, results[n]) for n in done(SCORE_RUNS)]
    lines += ["", "### Localization study (one epoch unless named; one change at a time from `soft_1ep`)", "",
              HEADER]
    lines += [_row(n, results[n]) for n in done(STUDY_RUNS)]
    lines += ["", "Overrides of each run (on top of `" + " ".join(BASE) + "`):", ""]
    lines += [f"- `{n}`: `{' '.join(RUNS[n])}`" for n in done(RUNS)]
    return "\n".join(lines)


def annotation_norms(data: Path, images: int = 200) -> dict[str, float]:
    """Mean L2 norm of the stride-16 annotations in cells whose centre lies inside an object's box,
    outside every box, and of the mean annotation (what the expectation gives under a flat map)."""
    config = load_config(REPO / BASE[0], [f"data.root={data}"])
    test = load_splits(config, ("test",))["test"]
    annotations = torch.from_numpy(np.asarray(test.annotations[:images], dtype=np.float32))  # [N, L, D]
    inside = [object_cells(truth, *test.grid) for truth in test.scenes[:images]]
    inside_t = torch.from_numpy(np.stack(inside))  # [N, L]
    norms = annotations.norm(dim=2)  # [N, L]
    mean = annotations.mean(dim=1).norm(dim=1).mean()
    return {"images": images, "inside": float(norms[inside_t].mean()), "outside": float(norms[~inside_t].mean()),
            "mean_annotation": float(mean)}


def norms_line(norms: dict[str, float]) -> str:
    return (f"Annotation norms on {norms['images']} test images (stride 16): cells inside an object's box "
            f"{norms['inside']:.1f}, other cells {norms['outside']:.1f}, the mean annotation (the expectation "
            f"under a flat map) {norms['mean_annotation']:.1f}.")


def main() -> int:
    args = study_parser(__doc__, data="data/study", out="runs/attention_study",
                        results="studies/attention_table/results", data_help=f"shapes data (made if missing: {COUNTS})",
                        table_doc="studies/attention_table/README.md").parse_args()
    torch.set_num_threads(1)  # the same budget for every run: one CPU thread
    data, out, kept = Path(args.data), Path(args.out), Path(args.results)
    if not args.tables_only and not (data / "dataset_shapes.json").exists():
        make_shapes(data, COUNTS, seed=0)
    results = {}
    for name in ORDER:
        overrides = RUNS[name]
        if args.tables_only or (args.only and args.only not in name):
            path = kept / f"{name}.json"
            if path.exists():
                results[name] = json.loads(path.read_text())
            continue
        results[name] = run(name, overrides, data=data, out=out, results=kept)
        print(_row(name, results[name]), flush=True)
    norms_path = kept / "annotation_norms.json"  # of the data, not of a run: measured once, kept like a run
    if not args.tables_only and not norms_path.exists():
        norms_path.write_text(json.dumps(annotation_norms(data), indent=2))
    norms = norms_line(json.loads(norms_path.read_text())) if norms_path.exists() else ""
    write_between(Path(args.doc), "tables", "python -m studies.attention_table.run", f"{tables(results)}\n\n{norms}")
    print(f"tables written to {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
