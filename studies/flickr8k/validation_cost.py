"""What one validation of Flickr8k's 1 000 val images costs, scored as eval.py reports (the config's
beam, the PTB tokenizer: what the recipe's train.val_beam_size and val_tokenizer ask) and as the
defaults score it (greedy, the project's own tokenizer), alternated, medians of --rounds.

    python -m studies.flickr8k.validation_cost --data /data/flickr8k --cache /tmp/flickr8k

The model is one decoder, as a training run validates one: the package's first shipped model
(studies/flickr8k/run.py: first_shipped, from the repository's history) with the recipe's decoding
(configs/flickr8k_soft.yaml: beam 3, length penalty 1, no 2-gram twice); the result goes to
results/validation_cost.json, and its numbers to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from captioning.checkpoint import load_trained
from captioning.config import apply_overrides, load_config
from captioning.train.validation import validation_beam, validation_metrics, validation_tokenizer
from studies.flickr8k.run import first_shipped
from studies.tables import REPO

# How validation scores: as eval.py reports (the recipe's settings), and as the defaults do.
SCORINGS = {"reported": ("train.val_beam_size=null", "train.val_tokenizer=ptb"),
            "greedy, own tokenizer": ("train.val_beam_size=1", "train.val_tokenizer=own")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="Flickr8k: dataset_flickr8k.json and Flicker8k_Dataset/")
    parser.add_argument("--cache", required=True, help="data.cache_root: the feature caches")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "studies/flickr8k/results/validation_cost.json")
    parser.add_argument("--runs", type=Path, default=REPO / "runs/flickr8k", help="where the first shipped model's "
                        "file is written")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = load_config(REPO / "configs/flickr8k_soft.yaml").decode
    decoding = [f"decode.{key}={getattr(recipe, key)}" for key in ("beam_size", "length_penalty", "no_repeat_ngram")]
    where = [f"data.root={args.data}", f"data.cache_root={args.cache}"]
    trained = load_trained(first_shipped(args.runs), overrides=[*where, *decoding])
    val, _ = trained.split("val")
    seconds: dict[str, list[float]] = {name: [] for name in SCORINGS}
    scored: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name, overrides in SCORINGS.items():
            config = apply_overrides(copy.deepcopy(trained.config), list(overrides))
            started = time.perf_counter()
            metrics = validation_metrics(trained.decoder, val, trained.vocab, config, device="cpu")
            seconds[name].append(time.perf_counter() - started)
            scored[name] = {"beam": validation_beam(config), "tokenizer": validation_tokenizer(config),
                            "Bleu_4": metrics["Bleu_4"], "CIDEr": metrics["CIDEr"]}
    result = {name: {**scored[name], "seconds": round(statistics.median(seconds[name]), 1),
                     "rounds": [round(s, 1) for s in seconds[name]]} for name in SCORINGS}
    result["images"] = len(val.records)
    result["torch_threads"] = torch.get_num_threads()
    args.out.write_text(json.dumps(result, indent=2))
    for name in SCORINGS:
        print(f"{name}: {result[name]['seconds']} s (beam {result[name]['beam']}, {result[name]['tokenizer']}), "
              f"BLEU-4 {result[name]['Bleu_4']:.3f}, CIDEr {result[name]['CIDEr']:.3f}")


if __name__ == "__main__":
    main()
