"""A model decoded on each val photo and on its mirror image together (test-time mirroring; not in the paper).

    python -m studies.flickr8k.mirror_decoding --data DATA --cache CACHE [--checkpoint PATH]

The photo flipped left-right is encoded once more (a cache of its own beside the val cache,
val_mirrored) and every decoder of the model reads it as a second member of one ensemble
(captioning.model.ensemble): each word from the mean of the members' probabilities, where a member
that reads the mirror image says "right" for "left" and "left" for "right" (data/flips.py), and
its map is flipped back. The model is the pair the package shipped before its fine-tuned member
joined it (seed 0, and seed 1 after SCST: its file from the repository's history, written once
under CACHE) unless --checkpoint names another; the photos and their mirror images are each read
from one cache, so its decoders must read one frozen encoder's annotations. Three
rows: the photos alone (as the model ships), the mirror images alone, both together. Written to
RESULTS/mirror_decoding.json and as a table into the study's README.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from captioning.checkpoint import load_trained
from captioning.data.features import load_or_compute
from captioning.data.flips import MIRRORED_WORDS, mirror_image
from captioning.data.splits import cache_encoder, features_dir
from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import evaluate_split
from captioning.model.ensemble import Ensemble
from captioning.model.paper import AttentionOutput, Draws, Memory
from captioning.model.state import DecoderState
from studies.flickr8k.run import PAIR_SHIPPED_COMMIT, shipped_at
from studies.tables import REPO, write_between

ROWS = {"photos": "the photos (as the model decodes)", "mirrored": "their mirror images alone",
        "both": "each photo and its mirror image together"}


class View(nn.Module):
    """A decoder that reads one half of annotations joined along the channels [B, L, 2D]: the photo's
    (part 0) or its mirror image's (part 1). Given `swap` (the mirror image's view), "left" and
    "right" trade places in the words it is fed and says, and its map is flipped back to the
    photo's columns."""

    def __init__(self, decoder: nn.Module, *, part: int, channels: int, swap: torch.Tensor | None,
                 grid: tuple[int, int]):
        super().__init__()
        self.decoder, self.part, self.channels, self.swap, self.grid = decoder, part, channels, swap, grid
        self.accelerator = None  # the step below, not the decoder's grouped fast path

    def start(self, annotations: torch.Tensor, draws: Draws | None = None) -> tuple[Memory, DecoderState]:
        own = annotations[..., self.part * self.channels:(self.part + 1) * self.channels]  # [B, L, D]
        return self.decoder.start(own, draws=draws)

    def next_word(self, memory: Memory, state: DecoderState,
                  tokens: torch.Tensor) -> tuple[torch.Tensor, DecoderState, AttentionOutput]:
        if self.swap is None:
            return self.decoder.next_word(memory, state, tokens)
        logits, state, attended = self.decoder.next_word(memory, state, self.swap[tokens])  # [N, V]
        alpha = attended.alpha.unflatten(1, self.grid).flip(-1).flatten(1)  # [N, L], the photo's columns
        return logits[:, self.swap], state, dataclasses.replace(attended, alpha=alpha)


def swapped_ids(vocab: Vocabulary) -> torch.Tensor:
    """[V] word ids with "left" and "right" (those in the vocabulary) traded."""
    swap = torch.arange(len(vocab))
    for word, other in MIRRORED_WORDS.items():
        if word in vocab.index and other in vocab.index:
            swap[vocab.index[word]] = vocab.index[other]
    return swap


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="data.root: Flickr8k")
    parser.add_argument("--cache", required=True, help="data.cache_root: the feature caches")
    parser.add_argument("--checkpoint", help="the model (default: the pair shipped before)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--results", default=str(REPO / "studies/flickr8k/results"))
    parser.add_argument("--doc", default=str(REPO / "studies/flickr8k/README.md"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.checkpoint or shipped_at(PAIR_SHIPPED_COMMIT, Path(args.cache) / "shipped_pair.pt")
    trained = load_trained(model, overrides=[f"data.root={args.data}", f"data.cache_root={args.cache}"])
    if trained.fine_tuned or len(trained.views) > 1:
        parser.error(f"{model}: its decoders read more than one frozen encoder's annotations; the photos and "
                     "their mirror images are read from one cache each")
    config, vocab = trained.config, trained.vocab
    val, photos = trained.split("val")
    mirrored = load_or_compute(features_dir(config), "val_mirrored", val.records,
                               encoder_factory=functools.cache(lambda: cache_encoder(config)),
                               image_size=config.data.image_size, batch_size=config.encoder.batch_size,
                               transform=mirror_image).annotations
    joined = np.concatenate([np.asarray(photos), np.asarray(mirrored)], axis=2)  # [N, L, 2D]
    channels, swap = photos.shape[2], swapped_ids(vocab)
    decoders = list(trained.decoder.members) if isinstance(trained.decoder, Ensemble) else [trained.decoder]
    views = {part: [View(decoder, part=part, channels=channels, swap=swap if part else None, grid=val.grid)
                    for decoder in decoders] for part in (0, 1)}
    d = config.decode  # how the model decodes, for every row
    kept = {}
    for name, members in (("photos", views[0]), ("mirrored", views[1]), ("both", views[0] + views[1])):
        model = Ensemble(members) if len(members) > 1 else members[0]
        start = time.perf_counter()
        metrics, _ = evaluate_split(model, joined, image_ids=val.image_ids, references=val.references, vocab=vocab,
                                    grid=val.grid, beam_size=d.beam_size, max_length=d.max_length,
                                    length_penalty=d.length_penalty, no_repeat_ngram=d.no_repeat_ngram,
                                    allow_unk=d.allow_unk)
        kept[name] = {"label": ROWS[name], "decoders": len(members), "decode_seconds": time.perf_counter() - start,
                      **metrics}
        print(name, {k: round(v, 4) for k, v in metrics.items() if k in ("Bleu_4", "METEOR", "CIDEr")}, flush=True)
    checkpoint = args.checkpoint or "the pair shipped before"
    Path(args.results, "mirror_decoding.json").write_text(json.dumps({"checkpoint": checkpoint, **kept}, indent=2))
    lines = ["| decoding | decoders | BLEU-1 | BLEU-4 | METEOR | ROUGE-L | CIDEr | distinct captions "
             "| words a caption |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['decoders']} | {r['Bleu_1']:.3f} | {r['Bleu_4']:.3f} | {r['METEOR']:.3f} | "
              f"{r['ROUGE_L']:.3f} | {r['CIDEr']:.3f} | {r['distinct_captions']:.0%} | {r['mean_length']:.1f} |"
              for r in kept.values()]
    command = "python -m studies.flickr8k.mirror_decoding --data DATA --cache CACHE"
    write_between(Path(args.doc), "flickr8k-mirror-decoding", command, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
