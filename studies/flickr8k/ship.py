"""The models that ship inside the package: the Flickr8k recipe's best.pt, cut to what captioning reads.

    python -m studies.flickr8k.ship --checkpoint runs/flickr8k/soft_side/best.pt --run soft_side \
        --checkpoint runs/flickr8k/scst_d3_greedy_lr5e-5/best.pt --run scst_d3_greedy_lr5e-5 \
        --checkpoint runs/flickr8k/finetune_block5/best.pt --run finetune_block5 --precision int8 \
        --data ../shared/flickr8k --cache /tmp/flickr8k

writes captioning/pretrained/flickr8k_soft.pt (config, with no path of the machine that trained it;
vocabulary; the decoder's weights in fp16, or int8 with --precision int8, and with several
--checkpoint each one's, decoded together as one ensemble in the one file, a fine-tuned run's
encoder stages with it; each run's record and validation history; and a release
note: the data, the shipped file's own numbers on the val split of --data, scored as `eval.py --split
val` scores them, the command that scores them again, the command that made it, the licence), then
captions scikit-image's public-domain sample photos with it and writes what it said and where it
looked (the most attended cell of each word) to captioning/pretrained/flickr8k_soft.json, and one
photo's per-word maps to docs/images/ (the README's picture). The tests hold the shipped file to
that JSON (tests/test_pretrained.py).

The shipped file decodes as the recipe does now (configs/flickr8k_soft.yaml's decode section, chosen
on val after the weights were trained: studies/flickr8k, "Decoding").

--name flickr8k_de ships the German model the same way (captioning/pretrained/flickr8k_de_soft.pt and
.json, docs/images/flickr8k_de_<picture>.jpg), scored on the val photos that have German captions:

    python -m studies.flickr8k.ship --name flickr8k_de --checkpoint runs/flickr8k/de/best.pt --run de \
        --precision int8 --data ../shared/flickr8k --cache /tmp/flickr8k

--from-shipped cuts the shipped file again from itself (its weights as they are, so its captions
too): how a note or a config written by an older version of this script is brought up to date.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from captioning.api import Captioner
from captioning.checkpoint import load_checkpoint, load_ensemble, load_trained, save_checkpoint
from captioning.config import load_config
from captioning.data.images import SAMPLE_PHOTOS, sample_photo
from captioning.eval.evaluate import evaluate_trained
from captioning.runtime.files import SCALE
from captioning.shipped import PRECISIONS, PRETRAINED, for_captioning
from studies.flickr8k.runs import RUNS
from studies.tables import REPO

PRETRAINED_DIR = REPO / "captioning" / "pretrained"
RESULTS = REPO / "studies" / "flickr8k" / "results"


@dataclasses.dataclass(frozen=True)
class Release:
    recipe: str  # the config whose decode section the shipped file decodes with
    data: str  # what it was trained and selected on
    licence: str


FLICKR8K = ("Trained on Flickr8k (Hodosh, Young & Hockenmaier, JAIR 2013), whose photos belong to their "
            "Flickr owners")
MIT = "The weights are released under the project's MIT licence on those terms."
RELEASES = {
    "flickr8k": Release("flickr8k_soft.yaml", "Flickr8k, Karpathy's split: trained on its 6 000 train images, "
                        "selected on its 1 000 val images (224x224 copies); the test split was held out",
                        f"{FLICKR8K}: for research use; cite the dataset. {MIT}"),
    "flickr8k_de": Release("flickr8k_de_soft.yaml", "Flickr8k's photos with Multi30k's German descriptions, "
                           "Karpathy's split: trained on the 5 528 train photos that have them, selected on the "
                           "934 val photos that have them (224x224 copies); the test split was held out",
                           f"{FLICKR8K}, with German descriptions from Multi30k (Elliott, Frank, Sima'an & Specia, "
                           f"VL 2016): for research use; cite both. {MIT}"),
}


STORED = {"fp16": "stored in fp16, computed in fp32",
          "int8": "stored as int8 codes with an fp16 scale per 32 numbers (vectors in fp16), computed in fp32"}


def release_note(*, runs: list[str], scored: dict, tokenizer: str, beam_size: int, decode: dict,
                 precision: str = "fp16", name: str = "flickr8k", language: str = "en") -> dict:
    """What the shipped model is: its data, its own numbers on val (`scored`, the fp16 file's: fp16
    storage moves the fp32 run's kept numbers in their fourth digit) and how they were decoded
    (`decode`: the length penalty, the n-gram block, <unk>), how to score them again, how it was made."""
    metrics = {k: round(scored[k], 4) for k in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")
               if k in scored}  # METEOR: English's only
    shipped = f"captioning/{PRETRAINED_DIR.name}/{PRETRAINED[name]}"
    release, pretrained = RELEASES[name], "--pretrained" + ("" if name == "flickr8k" else f" {name}")
    kept = ", ".join(f"studies/flickr8k/results/{run}.json" for run in runs)
    trained = "; ".join(f"python -m studies.flickr8k.run --only {run} --data DATA --cache CACHE"
                        for run in dict.fromkeys(step for run in runs for step in lineage(run)))
    cut = ("" if name == "flickr8k" else f"--name {name} ") + \
        " ".join(f"--checkpoint runs/flickr8k/{run}/best.pt --run {run}" for run in runs) + \
        (f" --precision {precision}" if precision != "fp16" else "")
    what = "the run's best.pt" if len(runs) == 1 else f"the best.pt of {len(runs)} runs, decoded together"
    return {"name": name, "language": language, "data": release.data,
            "val": {**metrics, "beam_size": beam_size, "tokenizer": tokenizer, "decode": decode},
            "scored": f"captioning verify {shipped} data.root=DATA, or python eval.py {pretrained} --split val "
                      f"--beam-size {beam_size} data.root=DATA",
            "cut_from": f"{what}, in fp32 (their numbers: {kept})",
            "weights": STORED[precision],
            "command": f"{trained}, then python -m studies.flickr8k.ship {cut} --data DATA --cache CACHE",
            "licence": release.licence}


def lineage(run: str) -> list[str]:
    """The runs to train, in order, for `run`: the runs it starts from (a warm start: SCST from a
    cross-entropy run), then itself."""
    start = RUNS[run].start if run in RUNS else None
    return [*lineage(start), run] if start and start in RUNS else [run]


def kept_history(payload: dict, *, run: str) -> dict:
    """The run's validations up to the checkpoint's step, from the study's kept curve, for a file cut
    before cuts kept its history (the same run's log: studies/flickr8k/run.py keeps its curve)."""
    progress = dict(payload.get("progress", {}))
    if "history" not in progress:
        curve = json.loads((RESULTS / f"{run}.json").read_text())["curve"]
        progress["history"] = [entry for entry in curve if entry["step"] <= progress.get("step", 0)]
    return {**payload, "progress": progress}


def samples(captioner: Captioner) -> dict[str, dict]:
    """Each sample photo's caption (beam 3) and the cell each word attended to most."""
    images = [sample_photo(name) for name in SAMPLE_PHOTOS]
    said = captioner.caption(images)
    return {name: {"caption": result.caption,
                   "cells": [int(alpha.argmax()) for alpha in result.alphas]}  # row-major over the grid
            for name, result in zip(SAMPLE_PHOTOS, said)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", action="append", help="a run's best.pt; given more than once, the runs "
                        "decode together as one ensemble in the one file")
    source.add_argument("--from-shipped", action="store_true", help="cut the shipped file again, its weights as "
                        "they are")
    parser.add_argument("--run", action="append", help="its name in studies/flickr8k/results (once per --checkpoint, "
                        "in the same order)")
    parser.add_argument("--name", default="flickr8k", choices=RELEASES, help="which shipped model (default: the "
                        "English flickr8k)")
    parser.add_argument("--data", required=True, help="Flickr8k (data.root): its val split scores the shipped file")
    parser.add_argument("--cache", help="data.cache_root, where the val split's feature cache is kept")
    parser.add_argument("--picture", default="motorcycle", choices=SAMPLE_PHOTOS, help="the README's photo")
    parser.add_argument("--precision", choices=PRECISIONS, help="how the weights are stored (default: fp16, or as "
                        "the shipped file stores them with --from-shipped); int8 for an ensemble that would not "
                        "fit 20 MB in fp16")
    args = parser.parse_args()
    target, release = PRETRAINED_DIR / PRETRAINED[args.name], RELEASES[args.name]
    runs = args.run or ["recipe"]
    if args.checkpoint and len(args.run or []) != len(args.checkpoint):
        parser.error("give one --run per --checkpoint, in the same order")
    if args.from_shipped:
        payload = load_checkpoint(target)
        precision = args.precision or ("int8" if any(name.endswith(SCALE) for name in payload["decoder"]) else "fp16")
        slim = for_captioning(kept_history(payload, run=runs[0]), members=payload.get("members", []),
                              precision=precision)
    else:
        precision = args.precision or "fp16"
        load_ensemble(args.checkpoint)  # one line naming the one that does not decode with the others
        first, *others = [load_checkpoint(path) for path in args.checkpoint]
        slim = for_captioning(first, members=others, precision=precision)
    slim["config"]["decode"] = dataclasses.asdict(load_config(REPO / "configs" / release.recipe).decode)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(target, slim)
    kept = json.loads((RESULTS / f"{runs[0]}.json").read_text())
    data = [f"data.root={args.data}", *([f"data.cache_root={args.cache}"] if args.cache else [])]
    evaluation, _ = evaluate_trained(load_trained(target, overrides=data), split="val", beam_size=kept["beam_size"])
    decode = slim["config"]["decode"]
    slim["release"] = release_note(runs=runs, scored=evaluation.metrics, tokenizer=evaluation.tokenizer,
                                   beam_size=evaluation.beam_size, decode={key: decode[key] for key in (
                                       "length_penalty", "no_repeat_ngram", "allow_unk", "max_length")},
                                   precision=precision, name=args.name, language=evaluation.config.data.language)
    save_checkpoint(target, slim)
    print(f"{target}: {target.stat().st_size / 2**20:.1f} MiB; on val: " + ", ".join(
        f"{k} {v}" for k, v in slim["release"]["val"].items()))
    torch.manual_seed(0)
    captioner = Captioner.from_checkpoint(target, device="cpu")
    said = samples(captioner)
    record = {key: value for key, value in slim["record"].items() if key != "val_image_digests"}  # the file has them
    card = {"release": slim["release"], "record": record, "picture": args.picture, "samples": said}
    target.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    for name, sample in said.items():
        print(f"{name}: {sample['caption']}")
    picture = REPO / "docs" / "images" / f"{args.name}_{args.picture}.jpg"
    picture.parent.mkdir(parents=True, exist_ok=True)
    captioner.caption(sample_photo(args.picture)).grid(thumbnail=160, columns=5).save(picture, quality=88)
    print(f"{picture}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
