"""Training pairs and their collation: padding, lengths, clipped targets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from captioning.data.dataset import CaptionPairs, collate
from captioning.data.records import ImageRecord
from captioning.data.tokenized import Tokenized
from captioning.data.vocab import Vocabulary, tokenize


def test_collate_pads_with_zero_and_keeps_lengths() -> None:
    items = [(torch.full((4, 3), float(i)), ids) for i, ids in enumerate([[1, 5, 2], [1, 5, 6, 7, 2], [1, 8, 9, 2]])]
    batch = collate(items)
    assert batch.annotations.shape == (3, 4, 3)
    assert torch.equal(batch.annotations[:, 0, 0], torch.tensor([0.0, 1.0, 2.0]))
    assert batch.lengths.tolist() == [3, 5, 4]
    assert batch.tokens.tolist() == [[1, 5, 2, 0, 0], [1, 5, 6, 7, 2], [1, 8, 9, 2, 0]]
    assert Vocabulary.pad_id == 0


def test_caption_pairs_clip_training_targets() -> None:
    captions = ("a red circle to the left of a blue square", "a circle")
    records = [ImageRecord(0, Path("x.png"), captions), ImageRecord(1, Path("y.png"), ("a blue square",))]
    vocab = Vocabulary.build([tokenize(c) for r in records for c in r.captions])
    annotations = np.arange(2 * 4 * 3, dtype=np.float16).reshape(2, 4, 3)
    pairs = CaptionPairs(annotations, Tokenized.of([r.captions for r in records]), vocab, max_length=3)
    assert len(pairs) == 3
    first, tokens = pairs[0]
    assert first.dtype == torch.float16 and torch.equal(first, torch.from_numpy(annotations[0]))  # as cached
    assert tokens == [vocab.start_id, *[vocab.index[w] for w in ("a", "red", "circle")], vocab.end_id]
    assert pairs[1][1] == [vocab.start_id, vocab.index["a"], vocab.index["circle"], vocab.end_id]
    assert torch.equal(pairs[2][0], torch.from_numpy(annotations[1]))
    unclipped = CaptionPairs(annotations, Tokenized.of([r.captions for r in records]), vocab)
    assert len(unclipped[0][1]) == 10 + 2


