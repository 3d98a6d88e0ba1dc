"""`captioning prepare` and `captioning prepare-features`: the vocabulary and the feature cache
of a config, made once before training (training makes whatever is missing itself, the same way).

The vocabulary comes from the *training* split alone: words seen fewer than `data.min_word_count`
times there become <unk> (5 for COCO, as in Karpathy's and most later setups). It is written to
TRAIN.OUT_DIR/vocab.json, which training then uses, and is stored in every checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from captioning.config import Config
from captioning.data.records import format_extra, read_records
from captioning.data.splits import Split, load_splits
from captioning.data.tokenized import tokenized, tokens_dir
from captioning.data.vocab import Vocabulary


def vocabulary_path(config: Config) -> Path:
    return Path(config.train.out_dir) / "vocab.json"


def build_vocabulary(config: Config) -> tuple[Vocabulary, dict[str, float]]:
    """The vocabulary of the training split, and a few numbers that help choose its settings."""
    captions = tokenized(read_records(config.data, "train"), cache=tokens_dir(config.data),
                         language=config.data.language)
    counts = captions.counts()
    vocab = Vocabulary.from_counts(counts, min_count=config.data.min_word_count)
    tokens = sum(counts.values())
    lengths = captions.lengths
    clip = config.data.max_caption_length
    stats = {
        "captions": len(lengths), "distinct_words": len(counts), "vocabulary": len(vocab),
        "unk_share": sum(n for w, n in counts.items() if w not in vocab.index) / max(tokens, 1),
        "length_p50": float(np.percentile(lengths, 50)), "length_p99": float(np.percentile(lengths, 99)),
        "clipped_share": float((lengths > clip).mean()),
    }
    return vocab, stats


def prepare_vocabulary(config: Config) -> tuple[Vocabulary, dict[str, float]]:
    vocab, stats = build_vocabulary(config)
    _write_vocabulary(config, vocab)
    return vocab, stats


def _write_vocabulary(config: Config, vocab: Vocabulary) -> None:
    path = vocabulary_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab.save(path)
    beside = format_extra(config.data, "beside_vocabulary")  # a folder of your own: its splits, written down
    if beside is not None:
        beside(config)


def run_vocabulary(config: Config) -> Vocabulary:
    """What a new run trains with: the vocabulary of this config's training captions, as `prepare`
    writes it to OUT_DIR/vocab.json. One there already is kept where it holds the same words. Another
    (an earlier run's, in the same train.out_dir, of other data or another data.min_word_count) is
    written anew, said in one line: kept, the run would train on it under a config that says otherwise."""
    path = vocabulary_path(config)
    vocab, _ = build_vocabulary(config)  # the captions' tokens are cached (data/tokenized.py): counted, not parsed
    if path.exists():
        there = Vocabulary.load(path)
        if there.words == vocab.words:
            return there
        print(f"note: {path} held another vocabulary ({len(there)} words) than this run's training captions give "
              f"with data.min_word_count={config.data.min_word_count} ({len(vocab)} words): written anew",
              file=sys.stderr)
    _write_vocabulary(config, vocab)
    return vocab


def prepare_features(config: Config, *, splits: tuple[str, ...] = ("train", "val", "test"),
                     device: str | torch.device = "cpu") -> dict[str, Split]:
    """The fp16 feature cache of every split (resuming an interrupted run where it stopped)."""
    return load_splits(config, splits, device=device, features=True, num_workers=config.train.num_workers)
