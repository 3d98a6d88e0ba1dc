"""evaluate_split's batching: any batch size gives every image its own caption and the same metrics.

Tested through the public signature only. The reference is each image decoded alone, one call of
captioning.model.decoding.decode per image, with no batching at all.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import decode_split, evaluate_split
from captioning.eval.metrics import caption_metrics
from captioning.model.decoding import decode
from captioning.model.paper import AdditiveScore, AttentionDecoder, SoftAttention

N, GRID, D, H = 8, (3, 3), 8, 16
L = GRID[0] * GRID[1]
WORDS = ["<pad>", "<start>", "<end>", "<unk>", "a", "red", "blue", "green", "circle", "square", "above", "below"]
IMAGE_IDS = [101, 57, 9, 3000, 12, 77, 41, 8]  # not 0..N-1: a row read as an id shows
BEAM, MAX_LENGTH = 2, 8


def make_decoder() -> AttentionDecoder:
    """A random decoder whose captions depend on the image (a sharp output layer, a loud context)
    and end at varied lengths (a push towards <end>)."""
    torch.manual_seed(0)
    attention = SoftAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=8))
    decoder = AttentionDecoder(vocab_size=len(WORDS), annotation_dim=D, embed_dim=8, hidden_dim=H,
                               attention=attention, dropout=0.0).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(4.0)
        decoder.init_h.weight.mul_(4.0)
        decoder.out_z.weight.mul_(5.0)
        decoder.out.bias[Vocabulary.end_id] += 3.0
    return decoder


@pytest.fixture(scope="module")
def split():
    annotations = 2 * np.random.default_rng(0).standard_normal((N, L, D)).astype(np.float32)
    references = [["a red circle above a blue square", "a red circle"], ["a green square"], ["a blue circle"],
                  ["a red square below a green circle"], ["a square"], ["a circle above a square"],
                  ["a blue square above a red circle"], ["green"]]
    return annotations, references


def alone(decoder: AttentionDecoder, annotations: np.ndarray, vocab: Vocabulary) -> list[str]:
    """Each image's caption from a decode of that image only."""
    captions = []
    for row in range(len(annotations)):
        tokens = decode(decoder, torch.from_numpy(annotations[row:row + 1]), beam_size=BEAM,
                        max_length=MAX_LENGTH).tokens[0]
        captions.append(" ".join(vocab.decode(tokens.tolist())))
    return captions


def test_batch_sizes_3_and_100_give_each_image_its_own_caption_and_the_same_metrics(split) -> None:
    annotations, references = split
    decoder, vocab = make_decoder(), Vocabulary(WORDS)
    expected = alone(decoder, annotations, vocab)
    assert len(set(expected)) >= 4, expected  # the images differ, so a caption given to the wrong image shows
    expected_results = [{"image_id": i, "caption": c} for i, c in zip(IMAGE_IDS, expected)]
    expected_metrics = caption_metrics(dict(zip(IMAGE_IDS, references)), dict(zip(IMAGE_IDS, expected)), full=False)

    for batch_size in (3, 100):  # 3: batches of 3, 3 and 2; 100: one batch
        metrics, results = evaluate_split(decoder, annotations, image_ids=IMAGE_IDS, references=references,
                                          vocab=vocab, grid=GRID, batch_size=batch_size, beam_size=BEAM,
                                          max_length=MAX_LENGTH, full=False)
        assert sorted(results, key=lambda r: r["image_id"]) == sorted(expected_results, key=lambda r: r["image_id"])
        assert metrics == pytest.approx(expected_metrics, rel=1e-9), batch_size


class LiveMaps:
    """A scorer that notes, at each caption it is shown, how many batches of attention maps are
    still alive (weak references to the array each caption's maps are a view of)."""

    def __init__(self) -> None:
        self.batches: list[weakref.ref] = []
        self.most_alive = 0

    def caption(self, index: int, words: list[str], alphas: np.ndarray) -> None:
        root = alphas
        while root.base is not None and isinstance(root.base, np.ndarray):
            root = root.base
        if not any(ref() is root for ref in self.batches):
            self.batches.append(weakref.ref(root))
        self.most_alive = max(self.most_alive, sum(ref() is not None for ref in self.batches))

    def images(self, decoder, annotations, start) -> None:
        pass


def test_decoding_a_split_holds_one_batch_of_maps_at_a_time(split) -> None:
    """Validation and evaluation decode 5 000 images on COCO: the maps of a batch are let go
    before the next batch's are made, so what is held does not grow with the split."""
    annotations, _ = split
    scorer = LiveMaps()
    decode_split(make_decoder(), annotations, image_ids=IMAGE_IDS, vocab=Vocabulary(WORDS), grid=GRID,
                 scorer=scorer, batch_size=2, max_length=MAX_LENGTH)
    assert len(scorer.batches) == N // 2  # every batch's maps were shown
    assert scorer.most_alive == 1
