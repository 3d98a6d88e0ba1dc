"""Caption metrics of captions in a language other than English: tokenized by Unicode words (never by
the English PTB tokenizer), METEOR left out with one line saying why, and the tokenizer named."""

from __future__ import annotations

import math

import pytest

from captioning.eval.metrics import _tokenized, caption_metrics, metrics_tokenizer

REFERENCES = {0: ["Ein Mädchen läuft über die Straße.", "Ein Kind rennt über eine Straße!"],
              1: ["Zwei Hunde spielen im Schnee."]}


def test_german_references_are_tokenized_as_german_training_targets_are() -> None:
    gts, res = _tokenized(REFERENCES, {0: "ein mädchen läuft", 1: "zwei hunde"}, use_java=False, language="de")
    assert gts == {0: ["ein mädchen läuft über die straße", "ein kind rennt über eine straße"],
                   1: ["zwei hunde spielen im schnee"]}
    assert res == {0: ["ein mädchen läuft"], 1: ["zwei hunde"]}


def test_bleu_on_german_counts_umlaut_words_whole_by_hand() -> None:
    # image 0: "ein mädchen läuft über die straße" is its first reference: every n-gram matches.
    # image 1: "zwei hunde spielen im see": 4 of 5 unigrams, 3 of 4 bigrams, 2 of 3, 1 of 2; same length, no penalty
    metrics = caption_metrics(REFERENCES, {0: "ein mädchen läuft über die straße", 1: "zwei hunde spielen im see"},
                              full=False, language="de")
    precisions = [(6 + 4) / (6 + 5), (5 + 3) / (5 + 4), (4 + 2) / (4 + 3), (3 + 1) / (3 + 2)]
    assert metrics["Bleu_4"] == pytest.approx(math.prod(precisions) ** 0.25, rel=1e-6)
    assert metrics["Bleu_1"] == pytest.approx(10 / 11, rel=1e-6)


def test_a_case_folded_or_split_umlaut_word_would_not_match() -> None:
    # "strasse" is not "straße", and "la uft" is not "läuft": a tokenizer that folded or split them would score 1
    exact = caption_metrics({0: ["Die Straße."]}, {0: "die straße"}, full=False, language="de")["Bleu_1"]
    folded = caption_metrics({0: ["Die Straße."]}, {0: "die strasse"}, full=False, language="de")["Bleu_1"]
    assert exact == pytest.approx(1.0) and folded == pytest.approx(0.5)


def test_full_metrics_in_german_leave_meteor_out_and_say_so_once(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = caption_metrics(REFERENCES, {0: "ein mädchen läuft über die straße", 1: "zwei hunde"}, language="de")
    assert set(metrics) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"}
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("note: METEOR is not scored on captions in de")
    assert "the project's Unicode words (de)" in said[0]


def test_the_tokenizer_is_named_with_its_language() -> None:
    assert metrics_tokenizer(language="de") == "the project's Unicode words (de)"
    assert metrics_tokenizer(ptb=False) == "the project's Treebank (no Java)"
