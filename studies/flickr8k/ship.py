"""The model that ships inside the package: the Flickr8k recipe's best.pt, cut to what captioning reads.

    python -m studies.flickr8k.ship --checkpoint runs/flickr8k/recipe/best.pt

writes captioning/pretrained/flickr8k_soft.pt (config, vocabulary, the decoder's weights in fp16, the
run's record, and a release note: the data, the val numbers kept in studies/flickr8k/results, the
command that made it, the licence), then captions scikit-image's public-domain sample photos with
it and writes what it said and where it looked (the most attended cell of each word) to
captioning/pretrained/flickr8k_soft.json, and one photo's per-word maps to docs/images/ (the
README's picture). The tests
hold the shipped file to that JSON (tests/test_pretrained.py).
"""

from __future__ import annotations

import argparse
import json

import torch

from captioning.api import Captioner
from captioning.checkpoint import PRETRAINED, for_captioning, load_checkpoint, save_checkpoint
from captioning.data.photos import SAMPLE_PHOTOS, sample_photo
from captioning.train.record import weights_digest
from studies.tables import REPO

PRETRAINED_DIR = REPO / "captioning" / "pretrained"
RESULTS = REPO / "studies" / "flickr8k" / "results"
LICENCE = ("Trained on Flickr8k (Hodosh, Young & Hockenmaier, JAIR 2013), whose photos belong to their "
           "Flickr owners: for research use; cite the dataset. The weights are released under the "
           "project's MIT licence on those terms.")


def release_note(*, run: str) -> dict:
    """What the shipped model is: its data, its val numbers as kept by the study, how it was made."""
    kept = json.loads((RESULTS / f"{run}.json").read_text())
    metrics = {k: round(kept[k], 4) for k in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")}
    return {"name": "flickr8k", "data": "Flickr8k, Karpathy's split: trained on its 6 000 train images, selected on "
                                        "its 1 000 val images (224x224 copies); the test split was held out",
            "val": {**metrics, "beam_size": kept["beam_size"], "tokenizer": kept["tokenizer"]},
            "command": f"python -m studies.flickr8k.run --only {run} --data DATA --cache CACHE, then "
                       f"python -m studies.flickr8k.ship --checkpoint runs/flickr8k/{run}/best.pt",
            "licence": LICENCE}


def samples(captioner: Captioner) -> dict[str, dict]:
    """Each sample photo's caption (beam 3) and the cell each word attended to most."""
    images = [sample_photo(name) for name in SAMPLE_PHOTOS]
    said = captioner.caption(images)
    return {name: {"caption": result.caption,
                   "cells": [int(alpha.argmax()) for alpha in result.alphas]}  # row-major over the grid
            for name, result in zip(SAMPLE_PHOTOS, said)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="the recipe's best.pt")
    parser.add_argument("--run", default="recipe", help="its name in studies/flickr8k/results")
    parser.add_argument("--picture", default="motorcycle", choices=SAMPLE_PHOTOS, help="the README's photo")
    args = parser.parse_args()
    payload = load_checkpoint(args.checkpoint)
    slim = for_captioning(payload, release=release_note(run=args.run))
    slim["record"] = {**slim.get("record", {}), "weights": {"decoder": weights_digest(slim["decoder"])}}
    target = PRETRAINED_DIR / PRETRAINED["flickr8k"]
    target.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(target, slim)
    print(f"{target}: {target.stat().st_size / 2**20:.1f} MiB")
    torch.manual_seed(0)
    captioner = Captioner.from_checkpoint(target, device="cpu")
    said = samples(captioner)
    card = {"release": slim["release"], "record": slim["record"], "picture": args.picture, "samples": said}
    target.with_suffix(".json").write_text(json.dumps(card, indent=2) + "\n")
    for name, sample in said.items():
        print(f"{name}: {sample['caption']}")
    picture = REPO / "docs" / "images" / f"flickr8k_{args.picture}.jpg"
    picture.parent.mkdir(parents=True, exist_ok=True)
    captioner.caption(sample_photo(args.picture)).grid(thumbnail=160, columns=5).save(picture, quality=88)
    print(f"{picture}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
