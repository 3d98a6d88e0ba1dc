"""data.mirror: training pairs mirrored left-right with "left" and "right" swapped in the caption."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data.dataset import CaptionPairs, ImageCaptionPairs
from captioning.data.features import load_or_compute
from captioning.data.flips import MirroredPairs, mirror_batches, mirror_image, mirror_words
from captioning.data.images import ImageFiles
from captioning.data.records import ImageRecord
from captioning.data.splits import features_dir, load_splits
from captioning.data.tokenized import Tokenized
from captioning.data.vocab import Vocabulary, tokenize
from captioning.train.loop import fit


def test_mirror_words_swaps_left_and_right_and_nothing_else() -> None:
    words = tokenize("A red circle to the left of a blue square, right above a green diamond")
    assert mirror_words(words) == tokenize("a red circle to the right of a blue square, left above a green diamond")
    assert mirror_words(mirror_words(words)) == words


def test_mirror_words_swaps_the_sides_inside_a_word_the_tokenizer_keeps_whole() -> None:
    """COCO's captions say "left-hand" and "leftmost", which the Treebank keeps as one token: left as
    they were, the mirrored caption was false. A word that merely starts or ends so is no side."""
    words = tokenize("The leftmost man holds a left-hand glove on the right-side of a left/right sign")
    assert "left-hand" in words and "right-side" in words  # one token each, as said
    assert mirror_words(words) == tokenize("the rightmost man holds a right-hand glove on the left-side of a "
                                           "right/left sign")
    assert mirror_words(mirror_words(words)) == words
    kept = tokenize("Leftover pizza in a bright kitchen, right-handed")
    assert mirror_words(kept) == tokenize("leftover pizza in a bright kitchen, left-handed")


def test_mirror_batches_is_a_pure_function_of_seed_and_epoch_and_keeps_the_cut() -> None:
    pairs = 1000
    batches = [list(range(start, min(start + 64, pairs))) for start in range(0, pairs, 64)]
    first = mirror_batches(batches, pairs=pairs, seed=0, epoch=3)
    assert first == mirror_batches(batches, pairs=pairs, seed=0, epoch=3)
    assert [len(b) for b in first] == [len(b) for b in batches]
    flat = [i for b in first for i in b]
    assert sorted(i % pairs for i in flat) == list(range(pairs))  # each pair once, plain or mirrored
    mirrored = {i - pairs for i in flat if i >= pairs}
    assert 400 < len(mirrored) < 600  # a fair coin
    for seed, epoch in ((0, 4), (1, 3)):  # another epoch or seed draws other coins
        drawn = mirror_batches(batches, pairs=pairs, seed=seed, epoch=epoch)
        other = {i - pairs for b in drawn for i in b if i >= pairs}
        assert other != mirrored
    # the coin belongs to the pair, not to where the epoch's order put it
    shuffled = mirror_batches([list(reversed(b)) for b in reversed(batches)], pairs=pairs, seed=0, epoch=3)
    assert {i - pairs for b in shuffled for i in b if i >= pairs} == mirrored


def _records(tmp_path: Path) -> list[ImageRecord]:
    return [ImageRecord(image_id=i, path=tmp_path / f"{i}.png", captions=captions) for i, captions in
            enumerate((("a red circle to the left of a blue square",), ("a green diamond", "a green diamond above")))]


def test_mirrored_pairs_read_the_mirror_annotations_and_the_swapped_caption(tmp_path: Path) -> None:
    records = _records(tmp_path)
    vocab = Vocabulary.build([tokenize(c) for r in records for c in r.captions] + [["right"]])
    annotations = np.zeros((2, 4, 3), dtype=np.float16)  # [N, L, D]
    mirrored = np.ones((2, 4, 3), dtype=np.float16)
    captions = Tokenized.of([r.captions for r in records])
    plain = CaptionPairs(annotations, captions, vocab)
    assert len(plain) == 3
    pairs = MirroredPairs(plain, CaptionPairs(mirrored, captions, vocab, words=mirror_words))
    assert len(pairs) == 6 and list(pairs.lengths) == list(plain.lengths)  # the epoch is cut from the 3 pairs
    source, tokens = pairs[0]
    assert torch.equal(source, torch.zeros(4, 3)) and vocab.decode(tokens)[3:6] == ["to", "the", "left"]
    source, tokens = pairs[3]  # pair 0 mirrored
    assert torch.equal(source, torch.ones(4, 3)) and vocab.decode(tokens)[3:6] == ["to", "the", "right"]
    assert len(tokens) == len(pairs[0][1])
    source, tokens = pairs[5]  # pair 2 (the second image's second caption) mirrored: nothing to swap
    assert torch.equal(source, torch.ones(4, 3)) and tokens == pairs[2][1]


def test_mirrored_image_pairs_flip_the_pixels(tmp_path: Path) -> None:
    records = _records(tmp_path)
    picture = np.zeros((32, 32, 3), dtype=np.uint8)
    picture[:, :8] = 255  # a white band on the left
    for record in records:
        Image.fromarray(picture).save(record.path)
    vocab = Vocabulary.build([tokenize(c) for r in records for c in r.captions] + [["right"]])
    images = {"image_size": 32, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
    captions = Tokenized.of([r.captions for r in records])
    pairs = MirroredPairs(ImageCaptionPairs(records, captions, vocab, **images),
                          ImageCaptionPairs(records, captions, vocab, **images, transform=mirror_image,
                                            words=mirror_words))
    plain, tokens, _ = pairs[0]
    flipped, mirrored_tokens, _ = pairs[3]
    assert plain[:, :, :8].min() == 1.0 and flipped[:, :, -8:].min() == 1.0 and flipped[:, :, :8].max() == 0.0
    assert torch.allclose(flipped, plain.flip(-1))
    assert "right" in vocab.decode(mirrored_tokens) and "left" in vocab.decode(tokens)


def test_the_mirror_cache_holds_the_flipped_images_annotations(tmp_path: Path, shapes_root: Path, tiny_config,
                                                                 encoder) -> None:
    config = tiny_config(tmp_path)
    records = load_splits(config, ("val",), features=False)["val"].records[:2]
    images = ImageFiles(records, size=96, mean=encoder.mean, std=encoder.std, transform=mirror_image)
    plain = ImageFiles(records, size=96, mean=encoder.mean, std=encoder.std)
    assert torch.allclose(images[0][1], plain[0][1].flip(-1), atol=1e-5)

    def _never():
        raise AssertionError("the cache was recomputed")

    directory = tmp_path / "cache"
    plain_cache = load_or_compute(directory, "val", records, encoder_factory=lambda: encoder, image_size=96)
    mirror_cache = load_or_compute(directory, "val_mirrored", records, encoder_factory=lambda: encoder,
                                   image_size=96, transform=mirror_image)
    with torch.no_grad():
        expected, _ = encoder(torch.stack([images[i][1] for i in range(2)]))  # [2, L, D]
    stored = np.asarray(mirror_cache.annotations, dtype=np.float32)
    assert np.allclose(stored, expected.numpy(), rtol=2e-3, atol=1e-2)  # stored as fp16
    assert not np.allclose(stored, np.asarray(plain_cache.annotations, dtype=np.float32), atol=1e-2)
    again = load_or_compute(directory, "val_mirrored", records, encoder_factory=_never, image_size=96,
                            transform=mirror_image)
    assert np.array_equal(again.annotations, mirror_cache.annotations)


def test_a_mirrored_run_trains_on_both_halves_from_its_own_cache(tmp_path: Path, shapes_root: Path, tiny_config,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    original = MirroredPairs.__getitem__

    def recording(self, index):
        read.append(index)
        return original(self, index)

    monkeypatch.setattr(MirroredPairs, "__getitem__", recording)
    config = tiny_config(tmp_path, "data.mirror=true", "train.max_steps=8")
    fit(config)
    assert (features_dir(config) / "train_mirrored.npy").exists()
    pairs = 24 * 5  # the session's tiny shapes data: 24 training images, 5 captions each
    assert len(read) == pairs and sorted(i % pairs for i in read) == list(range(pairs))  # one epoch, each pair once
    assert pairs // 4 < sum(i >= pairs for i in read) < 3 * pairs // 4
