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
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from captioning.checkpoint import pretrained_path
from captioning.config import load_config
from captioning.eval.evaluate import evaluate_checkpoint
from captioning.train.loop import fit
from captioning.train.validation import validation_beam, validation_tokenizer
from studies.tables import REPO, study_parser, write_between

CONFIGS = REPO / "configs"
METRICS = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


@dataclass(frozen=True)
class Run:
    group: str  # the table it belongs to
    label: str  # what it changes, as the table says it
    overrides: tuple[str, ...] = ()
    config: str = "flickr8k_soft.yaml"
    beam_size: int | None = None  # None: the config's (3)
    start: str | None = None  # SCST: the run whose best.pt it starts from ("shipped": the shipped model)
    decode: tuple[str, ...] = ()  # decode.* overrides when it is scored
    ablation: bool = False  # trained ABLATION_EPOCHS only, set beside the recipe's curve at that epoch
    split: str = "val"  # what it is scored on: train only to measure how a model fits its own training images
    members: tuple[str, ...] = ()  # an ensemble: the runs (or "shipped") whose best.pt decode together


# The budget at which hard and soft attention are set side by side: the epochs the hard recipe needed
# to stop improving (hard_10ep's best epoch was its 9th), and the dropout that did better than the
# recipe's 0.5 after 3 epochs.
SIDE = ("train.epochs=10", "model.dropout=0.3")

# Self-critical training's budget in the study: 2 epochs of 120 steps (train.max_steps the same, so a
# run stopped at 240 steps resumes as finished), validated every 60 steps, its losses every 5.
SCST_BUDGET = ("train.max_steps=240", "train.eval_every_steps=60", "train.log_every_steps=5")

# How the shipped model's run decoded, before the recipe took a length penalty and the n-gram block.
DECODED_AS_TRAINED = ("decode.length_penalty=0.0", "decode.no_repeat_ngram=0", "decode.allow_unk=false")

# An ablation trains this many epochs (of the recipe's 8) and is compared on the validation curve
# at that epoch, the recipe's own curve included: 2-core CPU time allows no more.
ABLATION_EPOCHS = 3


def _runs() -> dict[str, Run]:
    runs = {
        # what the decoder attends over: encoder x layer x input size (the images are 224² on disk)
        "lite0_stride16": Run("features", "EfficientNet-Lite0, stride 16, 224² (14x14x112)",
                              ("encoder.name=efficientnet_lite0", "encoder.layer=stride16"), ablation=True),
        "lite2_stride16": Run("features", "EfficientNet-Lite2, stride 16, 224² (14x14x120)",
                              ("encoder.layer=stride16",), ablation=True),
        "recipe": Run("features", "EfficientNet-Lite2, stride 32, 224² (7x7x352): the recipe"),
        # the recipe stopped where the ablations stop: their beam-3 numbers' reference
        "recipe_3ep": Run("recipe_3ep", "the recipe, 3 epochs", ablation=True),
        "lite2_head": Run("features", "EfficientNet-Lite2, head, 224² (7x7x1280)", ("encoder.layer=head",),
                          ablation=True),
        "lite2_160": Run("features", "EfficientNet-Lite2, stride 32, 160² (5x5x352)", ("data.image_size=160",),
                         ablation=True),
        "lite2_320": Run("features", "EfficientNet-Lite2, stride 32, 320² (10x10x352)", ("data.image_size=320",),
                         ablation=True),
        # the decoder's width and regularization
        "hidden256": Run("model", "embed 128, hidden 256, attention 128",
                         ("model.embed_dim=128", "model.hidden_dim=256", "model.attention_dim=128"), ablation=True),
        "hidden1024": Run("model", "embed 512, hidden 1024, attention 512",
                          ("model.embed_dim=512", "model.hidden_dim=1024", "model.attention_dim=512"), ablation=True),
        "dropout0.3": Run("model", "dropout 0.3", ("model.dropout=0.3",), ablation=True),
        "ds1": Run("model", "doubly stochastic λ = 1 (the authors' COCO script)", ("train.ds_lambda=1.0",),
                   ablation=True),
        # seeds of the final recipes
        "recipe_seed1": Run("seeds", "soft, seed 1", ("train.seed=1",)),
        "hard": Run("seeds", "hard, seed 0", config="flickr8k_hard.yaml"),
        "hard_seed1": Run("seeds", "hard, seed 1", ("train.seed=1",), config="flickr8k_hard.yaml"),
        # hard attention's best checkpoint was its last at 6 epochs: the same recipe given 10
        "hard_10ep": Run("seeds", "hard, seed 0, 10 epochs", ("train.epochs=10",), config="flickr8k_hard.yaml"),
        # self-critical training from the recipe's best.pt
        "scst": Run("scst", "SCST from the recipe", config="flickr8k_scst.yaml", start="recipe"),
        # Hard and soft side by side at one budget (10 epochs, dropout 0.3), each checkpoint kept on
        # what is reported (beam 3, the PTB tokenizer: the recipe's train.val_beam_size and val_tokenizer).
        "soft_side": Run("side", "soft, seed 0", SIDE),
        "hard_side": Run("side", "hard, seed 0", SIDE, config="flickr8k_hard.yaml"),
        "soft_side_seed1": Run("side", "soft, seed 1", (*SIDE, "train.seed=1")),
        "hard_side_seed1": Run("side", "hard, seed 1", (*SIDE, "train.seed=1"), config="flickr8k_hard.yaml"),
        # two more soft seeds at the side-by-side budget: the second pair of an ensemble of two
        "soft_side_seed2": Run("side", "soft, seed 2", (*SIDE, "train.seed=2")),
        "soft_side_seed3": Run("side", "soft, seed 3", (*SIDE, "train.seed=3")),
        # several checkpoints decoded together (captioning.model.ensemble; no training)
        "ensemble_seeds01": Run("ensemble", "soft seeds 0 and 1", members=("soft_side", "soft_side_seed1")),
        "ensemble_seeds23": Run("ensemble", "soft seeds 2 and 3", members=("soft_side_seed2", "soft_side_seed3")),
        "ensemble_seeds01_shipped": Run("ensemble", "soft seeds 0 and 1 and the shipped model",
                                        members=("soft_side", "soft_side_seed1", "shipped")),
    }
    # Self-critical training's budget, from the best cross-entropy model on val (soft_side_seed1):
    # 240 steps of 50 images (2 epochs), validated every 60 steps as eval.py reports. The first runs
    # sampled with flickr8k_scst.yaml's dropout (the recipe's 0.5) where their start was trained with
    # 0.3; the rest keep the start's 0.3.
    for name, label, overrides in (
            ("loo_lr5e-5", "dropout 0.5, leave-one-out baseline, lr 5e-5",
             ("train.lr=0.00005", "train.scst.baseline=leave_one_out")),
            ("loo_lr2e-4", "dropout 0.5, leave-one-out baseline, lr 2e-4",
             ("train.lr=0.0002", "train.scst.baseline=leave_one_out")),
            # stopped at its first validation: val CIDEr had fallen by a quarter
            ("greedy_lr5e-4", "dropout 0.5, greedy baseline, lr 5e-4, stopped after 60 steps",
             ("train.lr=0.0005", "train.max_steps=60")),
            ("d3_greedy_lr5e-5", "greedy baseline, lr 5e-5 (Rennie et al.)", ("train.lr=0.00005", "model.dropout=0.3")),
            ("d3_loo_lr5e-5", "leave-one-out baseline, lr 5e-5",
             ("train.lr=0.00005", "train.scst.baseline=leave_one_out", "model.dropout=0.3")),
            ("d3_loo_lr2e-4", "leave-one-out baseline, lr 2e-4",
             ("train.lr=0.0002", "train.scst.baseline=leave_one_out", "model.dropout=0.3"))):
        runs[f"scst_{name}"] = Run("scst_budget", label, (*SCST_BUDGET, *overrides), config="flickr8k_scst.yaml",
                                   start="soft_side_seed1")
    # the setting that paid, given 8 epochs, validated every 120 steps, stopped after 3 validations without gain
    runs["scst_d3_greedy_lr5e-5_long"] = Run(
        "scst_budget", "greedy baseline, lr 5e-5, up to 8 epochs",
        ("train.lr=0.00005", "model.dropout=0.3", "train.epochs=8", "train.eval_every_steps=120",
         "train.log_every_steps=5", "train.early_stop_patience=3"),
        config="flickr8k_scst.yaml", start="soft_side_seed1")
    # hard attention's best cross-entropy model on val, its settings (dropout 0.3, the 50% substitution
    # from the first step: its warm-up is behind it)
    runs["scst_hard_loo_lr5e-5"] = Run("scst_budget", "hard attention: leave-one-out baseline, lr 5e-5",
                                       (*SCST_BUDGET, "train.lr=0.00005", "train.scst.baseline=leave_one_out",
                                        "model.dropout=0.3", "model.attention=hard", "model.hard.warmup=0"),
                                       config="flickr8k_scst.yaml", start="hard_side_seed1")
    # What SCST's rewards see: the training images, where the model's captions score far above val's.
    for name in ("soft_side_seed1", "scst_d3_loo_lr2e-4", "scst_d3_greedy_lr5e-5"):
        runs[f"{name}_on_train"] = Run("scst_train_split", f"{name}, scored on the training images",
                                       start=name, split="train")
    for beam in (1, 2, 5, 10):  # the recipe's checkpoint decoded with other beams (no training)
        runs[f"recipe_beam{beam}"] = Run("beam", f"beam {beam}", beam_size=beam, start="recipe")
    # The shipped model decoded otherwise (no training): <unk>, the n-gram block, the length penalty,
    # each row from decoding as its run did (DECODED_AS_TRAINED), whatever the shipped file says now.
    for name, label, decode in (
            ("unk", "<unk> allowed (decoding before the block)", ("decode.allow_unk=true",)),
            ("default", "<unk> blocked (the default)", ()),
            ("ngram2", "no 2-gram twice", ("decode.no_repeat_ngram=2",)),
            ("ngram3", "no 3-gram twice", ("decode.no_repeat_ngram=3",)),
            ("lp0.5", "length penalty 0.5", ("decode.length_penalty=0.5",)),
            ("lp1", "length penalty 1", ("decode.length_penalty=1.0",)),
            ("ngram3_lp1", "no 3-gram twice, length penalty 1",
             ("decode.no_repeat_ngram=3", "decode.length_penalty=1.0")),
            ("ngram2_lp1", "no 2-gram twice, length penalty 1",
             ("decode.no_repeat_ngram=2", "decode.length_penalty=1.0")),
            ("ngram3_lp1.5", "no 3-gram twice, length penalty 1.5",
             ("decode.no_repeat_ngram=3", "decode.length_penalty=1.5")),
            ("ngram3_lp2", "no 3-gram twice, length penalty 2",
             ("decode.no_repeat_ngram=3", "decode.length_penalty=2.0"))):
        runs[f"shipped_{name}"] = Run("decoding", label, start="shipped", decode=(*DECODED_AS_TRAINED, *decode))
    return runs


RUNS = _runs()


def overrides_of(run: Run, *, data: Path, cache: Path, out: Path, name: str) -> list[str]:
    common = [f"data.root={data}", f"data.cache_root={cache}", f"train.out_dir={out / name}"]
    start = [f"train.init_from={out / run.start / 'best.pt'}"] if run.config == "flickr8k_scst.yaml" else []
    epochs = [f"train.epochs={ABLATION_EPOCHS}"] if run.ablation else []
    return [*common, *start, *run.overrides, *epochs]


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
    trained = {}
    if spec.members:  # several runs' models decoded together: the first one's config
        checkpoint = [pretrained_path() if m == "shipped" else out / m / "best.pt" for m in spec.members]
    elif spec.start == "shipped":  # the model the package ships, decoded otherwise
        checkpoint = pretrained_path()
    elif spec.group == "beam" or spec.split != "val":  # a run's model, decoded otherwise or on other images
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
            trained = {"train_seconds": round(summary["seconds"], 1), "steps": summary["steps"]}
            (out / name / ".finished").write_text(json.dumps(trained))
        trained = json.loads((out / name / ".finished").read_text())
    started = time.time()
    evaluation = evaluate_checkpoint(checkpoint, split=spec.split, beam_size=spec.beam_size,
                                     overrides=[f"data.root={data}", f"data.cache_root={cache}", *spec.decode])
    result = {"name": name, "group": spec.group, "label": spec.label, "config": spec.config,
              "overrides": list(spec.overrides), "decode": list(spec.decode),
              "split": spec.split, "beam_size": evaluation.beam_size, "tokenizer": evaluation.tokenizer,
              **{k: v for k, v in evaluation.metrics.items() if isinstance(v, (int, float))},
              "decode_seconds": round(time.time() - started, 1), **trained,
              "curve": curve(out / name) if trained else [],
              "validated_with": (f"beam {validation_beam(evaluation.config)}, {validation_tokenizer(evaluation.config)}"
                                 if trained else None),
              "torch_threads": torch.get_num_threads()}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def _at(result: dict, epoch: int, metric: str) -> str:
    """The run's greedy validation `metric` after `epoch` epochs, from its curve."""
    row = next((r for r in result.get("curve", []) if r["epoch"] == epoch), None)
    return "–" if row is None else f"{row[metric]:.3f}"


def _minutes(result: dict) -> str:
    return f"{result['train_seconds'] / 60:.0f}" if "train_seconds" in result else "–"


RECIPE_LABELS = {"features": "EfficientNet-Lite2, stride 32, 224² (7x7x352): the recipe",
                 "model": "embed 256, hidden 512, attention 256, dropout 0.5, λ = 0: the recipe"}


def ablation_table(results: dict[str, dict], group: str) -> str:
    """An ablation group beside the recipe stopped at the same epoch: the greedy validation curve
    (what training validates with: the package's own tokenizer) after each of the first
    ABLATION_EPOCHS epochs, and the best of those epochs' checkpoints as eval.py scores it."""
    epochs = range(1, ABLATION_EPOCHS + 1)
    lines = ["| run | " + " | ".join(f"BLEU-4 after {e}" for e in epochs) + f" | CIDEr after {ABLATION_EPOCHS} | "
             "beam 3: BLEU-4 | METEOR | CIDEr |", "|---|" + "---|" * (len(epochs) + 4)]
    rows = [r for r in results.values() if r["group"] == group and r["name"] != "recipe"]
    if "recipe_3ep" in results:  # the recipe's own first 3 epochs (the same run, stopped there)
        rows.insert(0, {**results["recipe_3ep"], "label": RECIPE_LABELS[group]})
    for r in rows:
        lines.append(f"| {r['label']} | " + " | ".join(_at(r, e, "Bleu_4") for e in epochs)
                     + f" | {_at(r, ABLATION_EPOCHS, 'CIDEr')} | "
                     + " | ".join(f"{r[m]:.3f}" for m in ("Bleu_4", "METEOR", "CIDEr")) + " |")
    return "\n".join(lines) if rows else "(no kept results yet)"


def _row(result: dict, label: str | None = None) -> str:
    cells = [f"{result[m]:.3f}" for m in METRICS]
    best = max(result["curve"], key=lambda r: r["Bleu_4"])["epoch"] if result.get("curve") else "–"
    return (f"| {label or result['label']} | " + " | ".join(cells) +
            f" | {result['distinct_captions']:.0%} | {result['mean_length']:.1f} | {best} | {_minutes(result)} |")


HEADER = ("| run | BLEU-1 | BLEU-4 | METEOR | ROUGE-L | CIDEr | distinct captions | words a caption | best epoch | "
          "train min |\n|---|---|---|---|---|---|---|---|---|---|")


def table(results: dict[str, dict], group: str) -> str:
    """A group scored as eval.py --split val scores it (pycocoevalcap, beam 3 unless it says)."""
    rows = [_row(r) for r in results.values() if r["group"] == group]
    if group == "beam" and "recipe" in results:
        rows.insert(2, _row(results["recipe"], "beam 3 (the recipe's)"))
    if group == "seeds" and "recipe" in results:
        rows.insert(0, _row(results["recipe"], "soft, seed 0 (the recipe)"))
    if group == "scst" and "recipe" in results:
        rows.insert(0, _row(results["recipe"], "the recipe (cross-entropy, the start)"))
    return "\n".join([HEADER, *rows]) if rows else "(no kept results yet)"


def scst_table(results: dict[str, dict]) -> str:
    """Self-critical training's budget: each run beside the cross-entropy model it started from,
    scored as eval.py --split val scores it, with the step its kept checkpoint was validated at."""
    lines = ["| run | from | steps | kept at step | BLEU-4 | METEOR | CIDEr | CIDEr against the start | "
             "distinct captions | words a caption | train min |", "|---|" + "---|" * 10]
    starts = [name for name in ("soft_side_seed1", "hard_side_seed1") if name in results]
    for name in starts:
        r = results[name]
        lines.append(f"| cross-entropy (the start) | – | – | – | {r['Bleu_4']:.3f} | {r['METEOR']:.3f} | "
                     f"{r['CIDEr']:.3f} | – | {r['distinct_captions']:.0%} | {r['mean_length']:.1f} | – |"
                     .replace("cross-entropy (the start) | –", f"cross-entropy (the start) | {name}"))
    for name, spec in RUNS.items():
        if spec.group != "scst_budget" or name not in results:
            continue
        r, start = results[name], results.get(spec.start)
        kept = max(r["curve"], key=lambda row: row["CIDEr"])["step"] if r.get("curve") else "–"
        change = f"{r['CIDEr'] / start['CIDEr'] - 1:+.1%}" if start else "–"
        lines.append(f"| {spec.label} | {spec.start} | {r.get('steps', '–')} | {kept} | {r['Bleu_4']:.3f} | "
                     f"{r['METEOR']:.3f} | {r['CIDEr']:.3f} | {change} | {r['distinct_captions']:.0%} | "
                     f"{r['mean_length']:.1f} | {_minutes(r)} |")
    return "\n".join(lines) if len(lines) > 2 + len(starts) else "(no kept results yet)"


def train_split_table(results: dict[str, dict]) -> str:
    """The same models scored on their training images and on val (beam 3, pycocoevalcap)."""
    lines = ["| model | images | BLEU-4 | METEOR | CIDEr |", "|---|---|---|---|---|"]
    for name in ("soft_side_seed1", "scst_d3_loo_lr2e-4", "scst_d3_greedy_lr5e-5"):
        for split, key in (("train", f"{name}_on_train"), ("val", name)):
            if key in results:
                r = results[key]
                label = (f"SCST: {RUNS[name].label}" if RUNS[name].group == "scst_budget"
                         else f"cross-entropy: {RUNS[name].label} (the start)")
                lines.append(f"| {label} | {split} | {r['Bleu_4']:.3f} | {r['METEOR']:.3f} | {r['CIDEr']:.3f} |")
    return "\n".join(lines) if len(lines) > 2 else "(no kept results yet)"


def decoding_table(results: dict[str, dict]) -> str:
    """The shipped model decoded otherwise: the caption metrics beside what changes in the captions."""
    lines = ["| decoding | BLEU-1 | BLEU-4 | METEOR | ROUGE-L | CIDEr | distinct captions | words a caption | "
             "with <unk> | a 3-gram twice |", "|---|" + "---|" * 9]
    for r in (r for r in results.values() if r["group"] == "decoding"):
        lines.append(f"| {r['label']} | " + " | ".join(f"{r[m]:.3f}" for m in METRICS)
                     + f" | {r['distinct_captions']:.0%} | {r['mean_length']:.1f} | {r['unk_captions']:.1%} | "
                       f"{r['repeated_3gram_captions']:.1%} |")
    return "\n".join(lines) if len(lines) > 2 else "(no kept results yet)"


def spread(results: dict[str, dict]) -> str:
    """Mean ± half the range of each final recipe over its seeds."""
    lines = ["| recipe | seeds | BLEU-1 | BLEU-4 | METEOR | CIDEr |", "|---|---|---|---|---|---|"]
    for label, names in (("soft", ("recipe", "recipe_seed1")), ("hard", ("hard", "hard_seed1")),
                         ("soft, side by side", ("soft_side", "soft_side_seed1")),
                         ("hard, side by side", ("hard_side", "hard_side_seed1")),
                         ("soft, side by side, seeds 2 and 3", ("soft_side_seed2", "soft_side_seed3")),
                         ("soft, two seeds decoded together", ("ensemble_seeds01", "ensemble_seeds23"))):
        kept = [results[n] for n in names if n in results]
        if not kept:
            continue
        cells = []
        for metric in ("Bleu_1", "Bleu_4", "METEOR", "CIDEr"):
            values = [r[metric] for r in kept]
            cells.append(f"{statistics.mean(values):.3f} ± {(max(values) - min(values)) / 2:.3f}")
        lines.append(f"| {label} | {len(kept)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# Xu et al. (2015), Table 1, Flickr8k (VGG-19 features, METEOR as the authors ran it), in percent.
PAPER = {"soft": {"Bleu_1": 67, "Bleu_2": 44.8, "Bleu_3": 29.9, "Bleu_4": 19.5, "METEOR": 18.93},
         "hard": {"Bleu_1": 67, "Bleu_2": 45.7, "Bleu_3": 31.4, "Bleu_4": 21.3, "METEOR": 20.30}}


# The strongest Flickr8k reproductions we know of that publish pycocoevalcap numbers on Karpathy's
# test split: Lu et al.'s (2017) spatial and adaptive attention, trained with a fine-tuned
# ResNet-152 by sulabhkatiyar/Spatial_Att and sulabhkatiyar/Adaptive_Att (their READMEs' tables).
ANCHORS = {
    "spatial attention, ResNet-152 fine-tuned, beam 3 (quoted from sulabhkatiyar/Spatial_Att)":
        {"Bleu_1": 0.663, "Bleu_2": 0.483, "Bleu_3": 0.337, "Bleu_4": 0.230, "METEOR": 0.211, "CIDEr": 0.566},
    "adaptive attention, ResNet-152 fine-tuned, beam 5 (quoted from sulabhkatiyar/Adaptive_Att)":
        {"Bleu_1": 0.659, "Bleu_2": 0.480, "Bleu_3": 0.339, "Bleu_4": 0.235, "METEOR": 0.207, "CIDEr": 0.589},
}

SIDE_LABEL = "seed {seed}, dropout 0.3, kept on beam 3 (PTB), the recipe's decoding"
# Our rows beside the paper's, by run name (a run not kept yet is left out).
OURS = {"soft": {"recipe": "soft, seed 0", "recipe_seed1": None,
                 "recipe_beam5": "soft, seed 0, beam 5 (the beam chosen on val)",
                 "soft_side": SIDE_LABEL.format(seed=0), "soft_side_seed1": SIDE_LABEL.format(seed=1),
                 "shipped_ngram2_lp1": "soft, the shipped model, length penalty 1, no 2-gram twice (chosen on val)",
                 "ensemble_seeds01": "soft, seeds 0 and 1 decoded together (an ensemble of two)",
                 "ensemble_seeds23": "soft, seeds 2 and 3 decoded together (an ensemble of two)",
                 "scst_d3_greedy_lr5e-5_long": "soft, seed 1, then self-critical training (greedy baseline, lr 5e-5)"},
        "hard": {"hard": None, "hard_seed1": None, "hard_10ep": None, "hard_side": SIDE_LABEL.format(seed=0),
                 "hard_side_seed1": SIDE_LABEL.format(seed=1)}}


def paper_table(results: dict[str, dict]) -> str:
    """The paper's Flickr8k rows beside ours (each of our rows: one run, on val, beam 3)."""
    metrics = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "CIDEr")
    lines = ["| model | split | BLEU-1 | BLEU-2 | BLEU-3 | BLEU-4 | METEOR | CIDEr |", "|---|---|" + "---|" * 6]
    for kind in ("soft", "hard"):
        paper = PAPER[kind]
        cells = [f"{paper[m] / 100:.3f}" if m in paper else "–" for m in metrics]
        lines.append(f"| paper, {kind} (VGG-19) | test | " + " | ".join(cells) + " |")
        for name, label in OURS[kind].items():
            if name in results:
                r = results[name]
                lines.append(f"| ours, {label or r['label']} | val | " + " | ".join(f"{r[m]:.3f}" for m in metrics)
                             + " |")
    for label, anchor in ANCHORS.items():
        lines.append(f"| {label} | test | " + " | ".join(f"{anchor[m]:.3f}" for m in metrics) + " |")
    return "\n".join(lines)


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
        print(name, " ".join(f"{m} {results[name][m]:.3f}" for m in METRICS), flush=True)
    doc, command = Path(args.doc), "python -m studies.flickr8k.run --tables-only"
    for group in ("features", "model"):
        write_between(doc, f"flickr8k-{group}", command, ablation_table(results, group))
    for group in ("beam", "seeds", "scst", "side", "ensemble"):
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
