"""The data of a training run: its splits, its vocabulary and its (image, caption) pairs, over the
feature cache or, for an encoder that runs on the fly, over the image files."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from captioning.config import Config
from captioning.data.dataset import Batch, CaptionPairs, ImageCaptionPairs, collate, collate_image_pairs
from captioning.data.encoded_images import EncodedCells, EncodedImages
from captioning.data.flips import MirroredPairs, mirror_image, mirror_words
from captioning.data.prepare import run_vocabulary
from captioning.data.records import DatasetError, held_out_note
from captioning.data.splits import Split, load_splits, missing_caches, uses_feature_cache
from captioning.data.tokenized import Tokenized, tokenized, tokens_dir
from captioning.data.vocab import Vocabulary
from captioning.model.encoder import Encoder
from captioning.runtime import distributed


@dataclass
class RunData:
    train: Split
    val: Split
    vocab: Vocabulary
    captions: Tokenized  # the training split's, tokenized (data/tokenized.py)
    pairs: Dataset  # CaptionPairs (cached annotations) or ImageCaptionPairs (images)
    collate: Callable[[list], Batch]
    val_annotations: Any  # the cache, or EncodedImages, or EncodedCells (encoder.cache_frozen)


def load_run_data(config: Config, *, vocab_words: list[str] | None, encoder: Encoder | None,
                  context: distributed.Distributed, device: torch.device) -> RunData:
    """Splits, vocabulary and training pairs. Rank 0 makes what is missing and quick to make (shapes
    data, vocab.json) while the others wait, then they all read it. A missing feature cache is not
    built under torchrun: the other processes would wait for hours (on COCO) with nothing to do.
    With encoder.cache_frozen the cache holds the output of `encoder`'s frozen stages, which it
    reads from then on in place of images."""
    cached = uses_feature_cache(config)
    if context.enabled and cached:
        missing = missing_caches(config, ("train", "val"))
        if missing:
            raise DatasetError(f"{missing[0]}: no feature cache; with several processes build it first, in one: "
                               f"`captioning prepare-features --config CONFIG [overrides]`, then start torchrun again")
    if not context.is_main:
        distributed.barrier(context, name="waiting for rank 0 to prepare the data")
    splits = load_splits(config, ("train", "val"), device=device, features=cached,
                         num_workers=config.train.num_workers)
    vocab = Vocabulary(vocab_words) if vocab_words is not None else run_vocabulary(config)
    if context.is_main:
        distributed.barrier(context, name="waiting for rank 0 to prepare the data")
        note = held_out_note(config.data)
        if note is not None:
            print(note, file=sys.stderr)
    train, val = splits["train"], splits["val"]
    captions = tokenized(train.records, cache=tokens_dir(config.data), language=config.data.language)
    pairs = training_pairs(config, train, captions, vocab, encoder=encoder)
    if encoder is None:
        return RunData(train, val, vocab, captions, pairs, collate, val.annotations)
    if cached:  # the frozen stages' output: the stages that train run on it (model/encoder.py)
        encoder.reading_cache(grid=train.grid, dim=train.annotations.shape[2])
        return RunData(train, val, vocab, captions, pairs, collate, EncodedCells(encoder, val.annotations,
                                                                                 device=device))
    encoded = EncodedImages(encoder, val.records, image_size=config.data.image_size, device=device)
    return RunData(train, val, vocab, captions, pairs, collate_image_pairs, encoded)


def training_pairs(config: Config, train: Split, captions: Tokenized, vocab: Vocabulary, *,
                   encoder: Encoder | None = None) -> Dataset:
    """(image, caption) pairs over the cache (of annotations, or of the frozen stages' output), or over
    the image files for an encoder on the fly; with data.mirror, doubled by their mirrors (data/flips.py)."""
    max_length = config.data.max_caption_length
    if uses_feature_cache(config):
        pairs: Dataset = CaptionPairs(train.annotations, captions, vocab, max_length=max_length)
        if config.data.mirror:  # the mirror images have a cache of their own (data/splits.py)
            mirrored = CaptionPairs(train.mirrored_annotations, captions, vocab, max_length=max_length,
                                    words=mirror_words)
            pairs = MirroredPairs(pairs, mirrored)
        return pairs
    images = {"image_size": config.data.image_size, "mean": encoder.mean, "std": encoder.std,
              "max_length": max_length, "augmented": config.data.augment}
    pairs = ImageCaptionPairs(train.records, captions, vocab, **images)
    if config.data.mirror:
        pairs = MirroredPairs(pairs, ImageCaptionPairs(train.records, captions, vocab, **images,
                                                       transform=mirror_image, words=mirror_words))
    return pairs
