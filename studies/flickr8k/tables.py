"""The study's tables, from the kept results (python -m studies.flickr8k.run --tables-only writes
them into the study's README and docs/results.md)."""

from __future__ import annotations

import statistics

from studies.flickr8k.runs import ABLATION_EPOCHS, METRICS, RUNS


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
    cells = [f"{result[m]:.3f}" if m in result else "–" for m in METRICS]  # METEOR: English's only
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
    if group == "hard_budget":  # the references: hard's two seeds of the side-by-side table
        references = [(name, f"hard, seed {seed}, as in the side-by-side table (the reference)")
                      for seed, name in enumerate(("hard_side", "hard_side_seed1")) if name in results]
        rows[:0] = [_row(results[name], label) for name, label in references]
    if group == "hard_finetune":  # the references: where each starts, and soft fine-tuned at the same budget
        references = [("hard_loo2", "hard, seed 0 (the start)"), ("hard_loo2_seed1", "hard, seed 1 (the start)"),
                      ("finetune_block5", "soft, seed 0, then block5 and block6 fine-tuned 4 epochs (soft's)"),
                      ("finetune_block5_seed1", "soft, seed 1, then block5 and block6 fine-tuned 4 epochs (soft's)")]
        rows[:0] = [_row(results[name], label) for name, label in references if name in results]
    if group == "stronger":  # the references: what each change starts from or adds to
        references = [("soft_side", "soft, seed 0 (the reference)"),
                      ("soft_side_seed1", "soft, seed 1 (the reference)"),
                      ("scst_d3_greedy_lr5e-5", "soft, seed 1, then SCST (greedy baseline, lr 5e-5; the reference)"),
                      ("ensemble_seeds01", "soft seeds 0 and 1 decoded together (the reference)")]
        rows[:0] = [_row(results[name], label) for name, label in references if name in results]
    return "\n".join([HEADER, *rows]) if rows else "(no kept results yet)"


def language_table(results: dict[str, dict]) -> str:
    """The German runs beside the English recipe on the same photos: each scored on its own language's
    references, tokenized as eval.py tokenizes that language, with the time from the images to the
    numbers."""
    lines = ["| run | language | val photos | vocabulary | BLEU-1 | BLEU-4 | METEOR | ROUGE-L | CIDEr | distinct "
             "captions | words a caption | best epoch | train min | images to numbers, min | threads | tokenized by |",
             "|---|" + "---|" * 15]
    for r in (r for r in results.values() if r["group"] == "language"):
        cells = [f"{r[m]:.3f}" if m in r else "–" for m in METRICS]
        best = max(r["curve"], key=lambda row: row["Bleu_4"])["epoch"] if r.get("curve") else "–"
        total = (r["wall_seconds_to_trained"] + r["decode_seconds"]) / 60 if "wall_seconds_to_trained" in r else None
        lines.append(f"| {r['label']} | {r['language']} | {r['images']} | {r['vocabulary']} | " + " | ".join(cells)
                     + f" | {r['distinct_captions']:.0%} | {r['mean_length']:.1f} | {best} | {_minutes(r)} | "
                     + ("–" if total is None else f"{total:.0f}") + f" | {r['torch_threads']} | {r['tokenizer']} |")
    return "\n".join(lines) if len(lines) > 2 else "(no kept results yet)"


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
    """The first shipped model decoded otherwise: the caption metrics beside what changes in the captions."""
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
                 "shipped_ngram2_lp1": "soft, the first shipped model (seed 1 above), length penalty 1, no 2-gram "
                                       "twice (chosen on val)",
                 "ensemble_seeds01": "soft, seeds 0 and 1 decoded together (an ensemble of two)",
                 "ensemble_seeds23": "soft, seeds 2 and 3 decoded together (an ensemble of two)",
                 "scst_d3_greedy_lr5e-5_long": "soft, seed 1, then self-critical training (greedy baseline, lr 5e-5)",
                 "scst_d3_greedy_lr5e-5_seed0": "soft, seed 0, then self-critical training (the same)",
                 "finetune_block6": "soft, seed 0, then Lite2's last block fine-tuned with the decoder (4 epochs)",
                 "finetune_block6_seed1": "soft, seed 1, the same",
                 "finetune_block5": "soft, seed 0, then Lite2 fine-tuned from block5 (its last six layers) with "
                                    "the decoder (4 epochs)",
                 "finetune_block5_seed1": "soft, seed 1, the same",
                 "finetune_block4": "soft, seed 0, then Lite2 fine-tuned from block4 (its last ten layers) with "
                                    "the decoder (4 epochs)",
                 "finetune_block4_seed1": "soft, seed 1, the same",
                 "ensemble_seed0_scst1": "soft, seed 0 and seed 1 after self-critical training, decoded together "
                                         "(the first pair shipped)",
                 "ensemble_pair_block5": "soft, that pair and the decoder fine-tuned from block5 (seed 0) over its own "
                                         "Lite2, decoded together (the trio shipped before)",
                 "ensemble_pair_block5_seed1": "soft, the same with the seed-1 decoder fine-tuned from block5",
                 "ensemble_seed2_scst1_block5": "soft, the trio shipped before with seed 2's decoder in place of seed "
                                                "0's (each member from its own seed)",
                 "ensemble_seed3_scst1_block5": "soft, the same with seed 3's: **the shipped model** (its fp32 "
                                                "checkpoints)"},
        "hard": {"hard": None, "hard_seed1": None, "hard_10ep": None, "hard_side": SIDE_LABEL.format(seed=0),
                 "hard_side_seed1": SIDE_LABEL.format(seed=1),
                 "hard_loo2": "hard, seed 0, as the row above with 2 location samples per caption and the "
                              "leave-one-out baseline (configs/flickr8k_hard.yaml as it is now)",
                 "hard_loo2_seed1": "hard, seed 1, the same",
                 "hard_finetune_block5": "hard, seed 0 (2 location samples, leave-one-out), then Lite2 fine-tuned from "
                                         "block5 with the decoder (4 epochs)",
                 "hard_finetune_block5_seed1": "hard, seed 1, the same",
                 "hard_from_soft": "hard, seed 0, from soft's seed 0 (dropout 0.3, the soft row above), then 4 "
                                   "epochs as hard attention (configs/flickr8k_hard_from_soft.yaml)",
                 "hard_from_soft_seed1": "hard, seed 1, the same from soft's seed 1"}}


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
