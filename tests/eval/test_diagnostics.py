"""Evaluation's diagnostics, each against a count made by hand on four captions."""

from __future__ import annotations

import pytest

from captioning.eval.evaluate import caption_diagnostics

CAPTIONS = {
    7: "a dog on the grass",                                    # 5 words
    8: "a dog on the grass",                                    # the same caption again
    9: "a man riding a wave riding a wave on a board",          # 11 words; "riding a wave" twice
    10: "a red bus on a street in a city next to a tall building",  # 14 words: at the limit of 14
    11: "a <unk> on a <unk>",                                   # 5 words, two of them <unk>
}
REFERENCES = {
    7: ["A dog lies on the grass.", "a brown dog"],             # 6 and 3 words
    8: ["Two dogs play!"],                                      # 3
    9: ["a surfer rides a big wave"],                           # 6
    10: ["a red double-decker bus on a city street", "a bus"],  # 8 ("double-decker" is one token) and 2
    11: ["a dog"],                                              # 2
}


def test_each_number_is_the_hand_count() -> None:
    got = caption_diagnostics(CAPTIONS, REFERENCES, max_length=14)
    assert got == pytest.approx({
        "distinct_captions": 4 / 5,
        # a dog on the grass man riding wave board red bus street in city next to tall building <unk>
        "vocabulary_used": 19.0,
        "at_length_limit": 1 / 5,
        "repeated_3gram_captions": 1 / 5,
        "unk_captions": 1 / 5,
        "mean_length": (5 + 5 + 11 + 14 + 5) / 5,
        "reference_mean_length": (6 + 3 + 3 + 6 + 8 + 2 + 2) / 7,
    })


def test_a_decoder_that_says_one_thing_of_everything_shows() -> None:
    same = {i: "a dog on the grass" for i in CAPTIONS}
    got = caption_diagnostics(same, REFERENCES, max_length=20)
    assert got["distinct_captions"] == 1 / 5 and got["vocabulary_used"] == 5 and got["at_length_limit"] == 0


def test_no_caption_no_numbers() -> None:
    assert caption_diagnostics({}, {}, max_length=20) == {}
