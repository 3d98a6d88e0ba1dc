"""How much of the shipped trio's lead on val is the choice of it: chosen on half of val, scored on the other half.

    python -m studies.flickr8k.selection --data DATA --cache CACHE --out runs/flickr8k
    python -m studies.flickr8k.selection --tables-only

The shipped model is the best of the trios the study decoded on val (studies/flickr8k, "A stronger
captioner"), scored on the same 1 000 photos it was picked on, so its lead over the trio shipped
before is optimistic by the choice. The test split stays held out; val itself can say how much.
Each trio's captions of val are decoded once (its members' best.pt under --out, as the study's run
decodes them) and each photo's CIDEr-D is kept (captioning.eval.metrics.cider_per_image: their
mean is the trio's CIDEr, the document frequencies from all 1 000 photos). Then, over many random
halvings of val, the trio with the best CIDEr on one half is scored on the other: its lead over the
trio shipped before on the half it was chosen on, against its lead on the half it was not. A
paired bootstrap over the photos gives the shipped trio's lead on all of val an interval. Kept in
RESULTS/selection.json (each photo's CIDEr, as each trio is scored), tabled into the study's README.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from captioning.checkpoint import load_ensemble
from captioning.eval.evaluate import evaluate_trained
from captioning.eval.metrics import cider_per_image
from studies.flickr8k.runs import RUNS
from studies.tables import REPO, study_parser, write_between

# The trios decoded at the recipe's decoding (beam 3) that the shipped one was picked among
CANDIDATES = ("ensemble_pair_block5", "ensemble_pair_block5_seed1", "ensemble_pair_scst_block5",
              "ensemble_seed2_scst1_block5", "ensemble_seed3_scst1_block5")
BEFORE = "ensemble_pair_block5"  # the trio shipped before
SHIPPED = "ensemble_seed3_scst1_block5"
SHORT = {BEFORE: "the trio shipped before", "ensemble_pair_block5_seed1": "with seed 1 fine-tuned",
         "ensemble_pair_scst_block5": "with the fine-tuned decoder after SCST",
         "ensemble_seed2_scst1_block5": "with seed 2", SHIPPED: "with seed 3 (shipped)"}
HALVINGS = 2000
RESAMPLES = 10_000


def photo_scores(name: str, *, data: Path, cache: Path, out: Path) -> dict:
    """A trio's captions of val, each photo's CIDEr-D, and their mean."""
    members = [out / member / "best.pt" for member in RUNS[name].members]
    trained = load_ensemble(members, overrides=[f"data.root={data}", f"data.cache_root={cache}"])
    evaluation, split = evaluate_trained(trained, split="val")
    captions = {r["image_id"]: r["caption"] for r in evaluation.results}
    references = {i: list(refs) for i, refs in zip(split.image_ids, split.references) if i in captions}
    scores = cider_per_image(references, captions)
    image_ids = sorted(scores)
    return {"image_ids": image_ids, "cider": [round(scores[i], 6) for i in image_ids],
            "CIDEr": evaluation.metrics["CIDEr"], "tokenizer": evaluation.tokenizer}


def chosen_on_one_half(scores: dict[str, np.ndarray], *, before: str, halvings: int = HALVINGS,
                       seed: int = 0) -> dict:
    """Over random halvings of the photos, the candidate with the best mean on one half (chosen),
    its lead over `before` on that half and on the other, and how often each candidate is chosen.
    scores: each candidate's per-photo scores, [N] each, the same photos in the same order."""
    names = list(scores)
    table = np.stack([scores[name] for name in names])  # [C, N]
    n = table.shape[1]
    rng = np.random.default_rng(seed)
    reference = names.index(before)
    lead_chosen_on, lead_other, chosen = [], [], []
    for _ in range(halvings):
        in_first = np.zeros(n, dtype=bool)
        in_first[rng.permutation(n)[: n // 2]] = True
        first, second = table[:, in_first].mean(axis=1), table[:, ~in_first].mean(axis=1)  # [C] each
        pick = int(first.argmax())
        chosen.append(pick)
        lead_chosen_on.append(first[pick] - first[reference])
        lead_other.append(second[pick] - second[reference])
    counts = np.bincount(chosen, minlength=len(names))
    return {"halvings": halvings, "lead_on_the_half_chosen_on": float(np.mean(lead_chosen_on)),
            "lead_on_the_other_half": float(np.mean(lead_other)),
            "other_half_lead_above_zero": float(np.mean(np.array(lead_other) > 0)),
            "chosen": {name: float(count / halvings) for name, count in zip(names, counts)}}


def paired_interval(a: np.ndarray, b: np.ndarray, *, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Mean of a - b over the photos, with a 95% interval from resampling the photos (paired)."""
    difference = a - b  # [N]
    rng = np.random.default_rng(seed)
    means = difference[rng.integers(0, len(difference), size=(resamples, len(difference)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(difference.mean()), "low": float(low), "high": float(high), "resamples": resamples}


def analysis(kept: dict) -> dict:
    ids = kept[BEFORE]["image_ids"]
    assert all(kept[name]["image_ids"] == ids for name in CANDIDATES), "the trios scored different photos"
    scores = {name: np.array(kept[name]["cider"]) for name in CANDIDATES}
    return {"chosen_on_one_half": chosen_on_one_half(scores, before=BEFORE),
            "shipped_against_before": paired_interval(scores[SHIPPED], scores[BEFORE])}


def table(kept: dict) -> str:
    found = analysis(kept)
    halves, lead = found["chosen_on_one_half"], found["shipped_against_before"]
    lines = ["| | CIDEr lead over the trio shipped before |", "|---|---|",
             f"| the shipped trio, on all 1 000 val photos (95% interval, {lead['resamples']:,} resamplings of the "
             f"photos) | {lead['mean']:+.3f} ({lead['low']:+.3f} to {lead['high']:+.3f}) |",
             f"| the best of the {len(CANDIDATES)} trios on one half of val, on that half (mean of "
             f"{halves['halvings']:,} halvings) | {halves['lead_on_the_half_chosen_on']:+.3f} |",
             f"| the same trio on the other half | {halves['lead_on_the_other_half']:+.3f} |"]
    chosen = ", ".join(f"{SHORT[name]} in {round(share * halves['halvings']):,}"
                       for name, share in halves["chosen"].items() if share)
    lines += ["", f"Chosen on the first half: {chosen} of the {halves['halvings']:,} halvings; the chosen trio's "
                  f"lead on the other half is above zero in {halves['other_half_lead_above_zero']:.1%} of them."]
    return "\n".join(lines)


def main() -> int:
    parser = study_parser(__doc__, data="../shared/flickr8k", out="runs/flickr8k",
                          results="studies/flickr8k/results", data_help="Flickr8k (data.root), only read",
                          table_doc="studies/flickr8k/README.md")
    parser.add_argument("--cache", help="data.cache_root (the study's)")
    args = parser.parse_args()
    if not args.tables_only and not args.cache:
        parser.error("--cache is needed to decode (or --tables-only)")
    path = Path(args.results) / "selection.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    if not args.tables_only:
        for name in CANDIDATES:
            if name in kept or (args.only and args.only not in name):
                continue
            kept[name] = photo_scores(name, data=Path(args.data), cache=Path(args.cache), out=Path(args.out))
            # the mean of the photos' scores is the trio's CIDEr as the study kept it
            study = json.loads((Path(args.results) / f"{name}.json").read_text())["CIDEr"]
            print(f"{name}: CIDEr {kept[name]['CIDEr']:.4f} (the study's {study:.4f}), the mean of its photos' "
                  f"{np.mean(kept[name]['cider']):.4f}", flush=True)
            path.write_text(json.dumps(kept) + "\n")  # kept as each trio is scored
    if all(name in kept for name in CANDIDATES):
        text = table(kept)
        write_between(REPO / args.doc, "flickr8k-selection", "python -m studies.flickr8k.selection --tables-only", text)
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
