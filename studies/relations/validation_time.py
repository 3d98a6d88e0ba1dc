"""What one validation costs on the embedded default, with and without the relation probe.

    python -m studies.relations.validation_time --checkpoint runs/shapes_soft/best.pt [--data data/shapes]

Training validates after every epoch: greedy captions of train.val_images validation images, scored,
and on the shapes data the relation probe (captioning.eval.shapes.probe: four teacher-forced captions per
ordered pair of objects). The probe does not depend on the decoding; this prints the cost of a
validation with and without it, alternated, medians of --rounds. Results: docs/results.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
from captioning.config import apply_overrides, from_dict
from captioning.data.splits import load_splits
from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import evaluate_split, scorer_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--data", default="data/shapes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    payload = load_checkpoint(args.checkpoint)
    config = apply_overrides(from_dict(payload["config"], where=f"{args.checkpoint}: config"),
                             [f"data.root={args.data}"])
    val = load_splits(config, ("val",))["val"]
    decoder, vocab = decoder_from_checkpoint(payload, config), Vocabulary(payload["vocab"])
    count = config.train.val_images or len(val.records)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for probe in (True, False):
            start = time.perf_counter()
            evaluate_split(decoder, val.annotations[:count], image_ids=val.image_ids[:count],
                           references=val.references[:count], vocab=vocab, grid=val.grid,
                           scorer=scorer_for(val, vocab, images=count, probe=probe), beam_size=1,
                           max_length=config.decode.max_length, full=False)
            seconds[probe].append(time.perf_counter() - start)
    with_probe, without = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(f"{count} validation images, {args.threads} threads, median of {args.rounds}: "
          f"{with_probe:.1f} s with the relation probe, {without:.1f} s without")


if __name__ == "__main__":
    main()
