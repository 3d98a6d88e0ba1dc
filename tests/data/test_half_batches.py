"""The fp16 cache stays fp16 on the host (items, collate, pinning) and is widened to float32 once on
the device, by Batch.to: half the bytes pinned and copied, the same float32 numbers in the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.data.dataset import Batch, CaptionPairs, collate
from captioning.data.records import ImageRecord
from captioning.data.tokenized import Tokenized
from captioning.data.vocab import Vocabulary, tokenize


@pytest.fixture
def pairs(tmp_path: Path) -> CaptionPairs:
    records = [ImageRecord(i, Path(f"{i}.png"), ("a red circle", "a blue square above a circle")) for i in range(3)]
    vocab = Vocabulary.build([tokenize(c) for r in records for c in r.captions])
    values = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float16)  # [N, L, D]
    np.save(tmp_path / "train.npy", values)
    captions = Tokenized.of([r.captions for r in records])
    return CaptionPairs(np.load(tmp_path / "train.npy", mmap_mode="r"), captions, vocab)


def test_collate_keeps_the_cache_dtype_and_to_widens_to_float32_with_the_same_values(pairs):
    batch = collate([pairs[i] for i in (0, 3, 5)])
    assert batch.annotations.dtype == torch.float16  # what a DataLoader pins and copies: 2 bytes a value
    if torch.cuda.is_available():  # DataLoader(pin_memory=True) calls this in its pinning thread
        assert batch.pin_memory().annotations.dtype == torch.float16
    moved = batch.to("cpu", non_blocking=True)
    assert moved.annotations.dtype == torch.float32  # what the model computes with
    assert torch.equal(moved.annotations, batch.annotations.float())  # fp16 -> fp32 is exact
    assert moved.tokens.dtype == torch.long and torch.equal(moved.tokens, batch.tokens)
    assert torch.equal(moved.lengths, batch.lengths)
    assert batch.annotations.dtype == torch.float16  # the batch moved from is left as it was


def test_a_batch_of_images_moves_as_it_is():
    images = torch.randn(2, 3, 8, 8)
    batch = Batch(annotations=None, images=images, tokens=torch.ones(2, 3, dtype=torch.long),
                  lengths=torch.tensor([3, 2]))
    moved = batch.to("cpu")
    assert moved.annotations is None and moved.source is moved.images and torch.equal(moved.images, images)


def test_scst_image_batches_stay_fp16_until_the_device(pairs):
    from captioning.train.scst import TrainingImages, collate_image_rows

    images = TrainingImages(pairs.annotations)
    batch = collate_image_rows([images[i] for i in (2, 0)])
    assert batch.annotations.dtype == torch.float16 and batch.images.tolist() == [2, 0]
    moved = batch.to(torch.device("cpu"))
    assert moved.annotations.dtype == torch.float32
    assert torch.equal(moved.annotations, torch.from_numpy(np.asarray(pairs.annotations[[2, 0]], dtype=np.float32)))
