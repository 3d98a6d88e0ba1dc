"""The relation probe: the questions it asks, how it answers them, and that its shared-prefix scoring
gives each caption the log-likelihood that scoring it alone under teacher forcing gives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from captioning.config import ExtrasConfig, ModelConfig
from captioning.data.shapes.scenes import RELATIONS, SceneObjects, ShapeObject
from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.eval.shapes import probe
from captioning.eval.shapes.probe import probe_scores, relation_log_likelihoods, relation_probe
from captioning.model.attention import choosing
from captioning.model.encoder_decoder import build_decoder
from captioning.model.paper import AttentionDecoder

WORDS = ["a", "red", "blue", "green", "circle", "square", "to", "the", "left", "right", "of", "above", "below"]
VOCAB = Vocabulary([*SPECIALS, *WORDS])
GRID = (3, 4)
RED = ShapeObject("circle", "red", "small", (10, 100, 30, 120))  # left of and above blue
BLUE = ShapeObject("square", "blue", "small", (150, 110, 170, 130))
GREEN = ShapeObject("circle", "green", "small", (10, 190, 30, 210))  # below red


def one_by_one(decoder: AttentionDecoder, annotations: torch.Tensor, pairs, vocab: Vocabulary):
    """The straightforward probe: each caption "a A <relation> a B" scored alone by the decoder's
    teacher-forced forward. -> whole captions [P, 4], the relation's own words [P, 4]."""
    whole, own = torch.zeros(len(pairs), len(RELATIONS)), torch.zeros(len(pairs), len(RELATIONS))
    with torch.no_grad():
        for p, (image, a, b) in enumerate(pairs):
            for k, stated in enumerate(RELATIONS):
                words = stated.split()
                tokens = torch.tensor([vocab.encode(["a", *a, *words, "a", *b])])  # [1, T + 1]
                logits = decoder(annotations[image:image + 1], tokens[:, :-1]).logits  # [1, T, V]
                picked = torch.log_softmax(logits, dim=2).gather(2, tokens[:, 1:, None])[0, :, 0]  # [T]
                whole[p, k] = picked.sum()
                own[p, k] = picked[3:3 + len(words)].sum()  # after "a", colour, shape
    return whole, own


DECODERS = {  # name -> model config changes: every path the decoder's step can take
    "additive": {},  # soft, additive: the fused recurrence in forward, the generic one in step
    "local_layout_glimpses_coordinates": {"score": "local", "deep_output": "tanh",
                                          "extras": ExtrasConfig(init="layout", glimpses=2, position="coordinates")},
    "location": {"score": "location"},
    "hard": {"attention": "hard"},
    # self-attention over the words (its keys and values put together for captions of different
    # lengths: padded, never attended) and over the grid
    "self_attention": {"extras": ExtrasConfig(word_attention=True, grid_attention=2)},
    "self_attention_hard_query_word": {"attention": "hard", "extras": ExtrasConfig(word_attention=True,
                                                                                   query_word=True)},
}


@pytest.mark.parametrize(("name", "choice"), [*((name, None) for name in DECODERS), ("hard", "argmax")])
def test_shared_prefix_scoring_equals_scoring_each_caption_alone(name: str, choice: str | None) -> None:
    torch.manual_seed(0)
    model = dataclasses.replace(ModelConfig(embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0),
                                **DECODERS[name])
    decoder = build_decoder(model, vocab_size=len(VOCAB), annotation_dim=6, grid=GRID).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(3.0)  # far from uniform, so that a misplaced token shows
    annotations = torch.randn(3, GRID[0] * GRID[1], 6)
    # Image 0: two first objects with the same words (they share a prefix); image 2: none asked.
    pairs = [(0, ("red", "circle"), ("blue", "square")), (1, ("green", "circle"), ("red", "circle")),
             (0, ("blue", "square"), ("red", "circle")), (0, ("red", "circle"), ("green", "circle")),
             (1, ("red", "circle"), ("green", "circle"))]
    with choosing(decoder, choice):
        whole, own = relation_log_likelihoods(decoder, annotations, pairs, VOCAB)
        want_whole, want_own = one_by_one(decoder, annotations, pairs, VOCAB)
    assert whole.shape == own.shape == (len(pairs), len(RELATIONS))
    torch.testing.assert_close(whole, want_whole, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(own, want_own, atol=1e-4, rtol=1e-5)
    assert (whole.std(dim=1) > 0.1).all()  # the four captions really differ


def test_relation_probe_asks_every_ordered_pair_and_takes_the_likeliest_relation(monkeypatch) -> None:
    truths = [SceneObjects([RED], 224, 224), SceneObjects([RED, BLUE, GREEN], 224, 224)]
    asked = []

    def log_likelihoods(decoder, annotations, pairs, vocab):
        asked.extend(pairs)
        # Per pair: the whole caption prefers "to the left of" (+4) over "above" (+1); the relation's
        # own words prefer "above" (+1).
        whole = torch.tensor([[4.0, 0.0, 1.0, 0.0]]).repeat(len(pairs), 1)
        own = torch.tensor([[0.0, 0.0, 1.0, 0.0]]).repeat(len(pairs), 1)
        return whole, own

    monkeypatch.setattr(probe, "relation_log_likelihoods", log_likelihoods)
    answers = relation_probe(None, torch.zeros(2, 4, 6), truths, VOCAB)
    # One object: no pair; three objects: 6 ordered pairs, image by image, A then B.
    red, blue, green = ("red", "circle"), ("blue", "square"), ("green", "circle")
    assert asked == [(1, red, blue), (1, red, green), (1, blue, red), (1, blue, green), (1, green, red),
                     (1, green, blue)]
    # "to the left of" holds for red -> blue and green -> blue (140 px apart in x, 80 in y); red is
    # above green (the same x), and nothing is left of red.
    left, right, above, below = range(4)
    assert [(a.truth, a.picked, a.words) for a in answers] == [
        (left, left, above), (above, left, above), (right, left, above), (right, left, above),
        (below, left, above), (left, left, above)]
    # What holds of A and some other object: red {left of blue, above green}, blue {right of both},
    # green {below red, left of blue}.
    assert [a.holding for a in answers] == [{left, above}] * 2 + [{right}] * 2 + [{below, left}] * 2
    scores = probe_scores(answers)
    assert scores["relation_probe_accuracy"] == pytest.approx(2 / 6)
    assert scores["relation_probe_axis"] == pytest.approx(4 / 6)  # "left" has the axis of left and right
    assert scores["relation_probe_direction"] == pytest.approx(2 / 4)  # of those four, the two lefts
    assert scores["relation_probe_words"] == pytest.approx(2 / 6)  # "above" holds of red only
    assert scores["relation_probe_words_chance"] == pytest.approx((2 + 2 + 1 + 1 + 2 + 2) / 6 / 4)
    assert scores["relation_probe_pairs"] == 6
    assert np.isnan(probe_scores([])["relation_probe_accuracy"])
    assert relation_probe(None, torch.zeros(1, 4, 6), truths[:1], VOCAB) == []
