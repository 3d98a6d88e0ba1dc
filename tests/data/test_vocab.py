"""Tokenizer and vocabulary: normalization, <unk>, encode/decode, save/load."""

from __future__ import annotations

import pytest

from captioning.data.vocab import SPECIALS, Vocabulary, tokenize
from captioning.model.tokens import END, PAD, START, UNK


@pytest.mark.parametrize("caption, tokens", [
    ("A red, round Circle.", ["a", "red", "round", "circle"]),
    ("Two  cats -- on a MAT?!", ["two", "cats", "on", "a", "mat"]),
    ("\u201cHello\u201d she said!", ["hello", "she", "said"]),
    ("", []),
    ("...", []),
])
def test_tokenize_lowercases_and_drops_punctuation(caption, tokens):
    assert tokenize(caption) == tokens


def test_curly_quotes_tokenize_like_straight_ones():
    straight = tokenize("The dog's ball is \"big\"")
    curly = tokenize("The dog\u2019s ball is \u201cbig\u201d")
    assert curly == straight
    assert "'s" in curly  # the clitic survives as a word, the quote marks do not
    assert not any(token in ('"', "``", "''", "\u201c", "\u201d") for token in curly)


def test_tokenize_applies_unicode_compatibility_normalization():
    assert tokenize("\ufb01ne") == ["fine"]  # the 'fi' ligature


def test_specials_have_the_documented_ids():
    vocab = Vocabulary.build([["a"]])
    assert vocab.words[:4] == list(SPECIALS) == [PAD, START, END, UNK]
    assert (vocab.pad_id, vocab.start_id, vocab.end_id, vocab.unk_id) == (0, 1, 2, 3)
    assert [vocab.index[w] for w in SPECIALS] == [0, 1, 2, 3]


def test_build_keeps_words_seen_min_count_times_sorted():
    captions = [["a", "red", "circle"], ["a", "blue", "circle"], ["a", "red", "square"]]
    vocab = Vocabulary.build(captions, min_count=2)
    assert vocab.words == list(SPECIALS) + ["a", "circle", "red"]
    assert len(vocab) == 7
    assert Vocabulary.build(captions).words == list(SPECIALS) + ["a", "blue", "circle", "red", "square"]


def test_rare_and_unseen_words_encode_as_unk():
    vocab = Vocabulary.build([["a", "red", "circle"], ["a", "blue", "circle"]], min_count=2)
    ids = vocab.encode(["a", "blue", "circle", "zebra"])
    assert ids == [vocab.start_id, vocab.index["a"], vocab.unk_id, vocab.index["circle"], vocab.unk_id, vocab.end_id]


def test_encode_wraps_in_start_and_end():
    vocab = Vocabulary.build([["a", "b", "c"]])
    assert vocab.encode(["a", "b", "c"]) == [1, 4, 5, 6, 2]
    assert vocab.encode([]) == [1, 2]


def test_encode_clips_to_max_length_words_keeping_end():
    vocab = Vocabulary.build([["a", "b", "c", "d"]])
    words = ["a", "b", "c", "d"]
    assert vocab.encode(words, max_length=2) == [1, vocab.index["a"], vocab.index["b"], 2]
    assert vocab.encode(words, max_length=10) == vocab.encode(words)
    assert vocab.encode(words, max_length=0) == [1, 2]


def test_decode_stops_at_end_and_drops_specials():
    vocab = Vocabulary.build([["a", "b", "c"]])
    a, b, c = (vocab.index[w] for w in "abc")
    assert vocab.decode([1, a, b, 2, c, c]) == ["a", "b"]
    assert vocab.decode([a, 0, b, 1, c]) == ["a", "b", "c"]  # <pad>/<start> dropped, no <end>: all
    assert vocab.decode([2, a]) == []
    assert vocab.decode([a, b, 2, 0, 0]) == ["a", "b"]


def test_decode_accepts_tensors():
    torch = pytest.importorskip("torch")
    vocab = Vocabulary.build([["a", "b"]])
    assert vocab.decode(torch.tensor([1, 4, 5, 2, 0])) == ["a", "b"]


def test_encode_then_decode_round_trips_known_words():
    vocab = Vocabulary.build([tokenize("A red circle left of a blue square.")])
    words = tokenize("a blue circle left of a red square")
    assert vocab.decode(vocab.encode(words)) == words


def test_save_load_round_trip(tmp_path):
    vocab = Vocabulary.build([["zebra", "apple", "mango"], ["apple"]])
    path = tmp_path / "vocab.json"
    vocab.save(path)
    loaded = Vocabulary.load(path)
    assert loaded.words == vocab.words
    assert loaded.index == vocab.index
    assert loaded.encode(["mango", "kiwi"]) == vocab.encode(["mango", "kiwi"])


def test_vocabulary_must_start_with_specials_and_hold_no_duplicates():
    with pytest.raises(ValueError, match="start with"):
        Vocabulary(["a", "b"])
    with pytest.raises(ValueError, match="twice"):
        Vocabulary(list(SPECIALS) + ["a", "a"])


def test_normalize_is_shared_by_training_targets_and_references() -> None:
    from captioning.data.vocab import normalize

    assert normalize("  A “Big”\tDog’s  BALL. ") == 'a "big" dog\'s ball.'
    assert tokenize("  A “Big”\tDog’s  BALL. ") == tokenize('a "big" dog\'s ball') == ["a", "big", "dog", "'s", "ball"]
    assert tokenize("„Quoted“ «text» ‚here‘") == ["quoted", "text", "here"]
