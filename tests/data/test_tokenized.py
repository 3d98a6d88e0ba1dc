"""Tokenized captions: the same tokens and ids as tokenizing and encoding each caption, in arrays,
kept on disk under a name that changes with any caption or the tokenizer."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from captioning.data import tokenized as tokenized_module
from captioning.data.dataset import CaptionPairs
from captioning.data.flips import mirror_words
from captioning.data.records import ImageRecord
from captioning.data.tokenized import Tokenized, tokenized
from captioning.data.vocab import Vocabulary, tokenize
from tests.tiny import REPO

CAPTIONS = [("A red Circle, to the left of a square.", "a circle"), ("Two “big” squares!",),
            (), ("the dog's ball is right of it", "a circle to the right of a circle above a big square")]


def _records(captions=CAPTIONS) -> list[ImageRecord]:
    return [ImageRecord(i, Path(f"{i}.png"), raw) for i, raw in enumerate(captions)]


def test_each_image_reads_as_tokenizing_its_captions_one_by_one() -> None:
    captions = Tokenized.of(CAPTIONS)
    assert len(captions) == len(CAPTIONS)
    assert [captions[i] for i in range(len(captions))] == [[tokenize(c) for c in raw] for raw in CAPTIONS]
    assert captions.lengths.tolist() == [len(tokenize(c)) for raw in CAPTIONS for c in raw]
    every = [token for raw in CAPTIONS for c in raw for token in tokenize(c)]
    assert captions.counts() == {word: every.count(word) for word in set(every)}


def test_a_large_split_tokenized_by_a_pool_of_processes_reads_as_one_process_tokenizing_it(monkeypatch) -> None:
    captions = [(f"{i} {raw[0]}" if raw else f"image {i}", *raw[1:]) for i in range(60) for raw in CAPTIONS]
    alone = Tokenized.of(captions)
    monkeypatch.setattr(tokenized_module, "PARALLEL_FROM", 10)
    monkeypatch.setattr(tokenized_module, "CHUNK", 7)
    pooled = Tokenized.of(captions)
    assert pooled.words == alone.words
    for array in ("ids", "offsets", "first"):
        np.testing.assert_array_equal(getattr(pooled, array), getattr(alone, array))


@pytest.mark.parametrize("max_length", [None, 3])
@pytest.mark.parametrize("words", [list, mirror_words])
def test_encoded_pairs_are_vocab_encode_of_each_caption(max_length, words) -> None:
    vocab = Vocabulary.build([tokenize(c) for c in ("a red circle left of a square", "a square")])  # some <unk>
    images, ids, offsets = Tokenized.of(CAPTIONS).encoded(vocab, max_length=max_length, words=words)
    expected = [(i, vocab.encode(words(tokenize(c)), max_length)) for i, raw in enumerate(CAPTIONS) for c in raw]
    assert [(int(images[p]), ids[offsets[p]:offsets[p + 1]].tolist()) for p in range(len(images))] == expected


def test_the_second_run_reads_the_tokens_from_disk_and_a_changed_caption_tokenizes_again(tmp_path, monkeypatch):
    first = tokenized(_records(), cache=tmp_path, language="en")
    assert len(list(tmp_path.glob("*.npz"))) == 1

    def refuse(caption: str, *, language: str) -> list[str]:
        raise AssertionError("tokenized again")

    monkeypatch.setattr(tokenized_module, "tokenize", refuse)
    again = tokenized(_records(), cache=tmp_path, language="en")
    assert again.words == first.words and [again[i] for i in range(4)] == [first[i] for i in range(4)]
    for array in ("ids", "offsets", "first"):
        np.testing.assert_array_equal(getattr(again, array), getattr(first, array))
    changed = [*CAPTIONS[:3], ("the dog's ball is left of it", CAPTIONS[3][1])]
    with pytest.raises(AssertionError, match="tokenized again"):
        tokenized(_records(changed), cache=tmp_path, language="en")
    with pytest.raises(AssertionError, match="tokenized again"):  # the same captions in another language's words
        tokenized(_records(), cache=tmp_path, language="de")
    monkeypatch.setattr(tokenized_module, "tokenization", lambda language: "another tokenizer")  # a new tokenizer
    with pytest.raises(AssertionError, match="tokenized again"):
        tokenized(_records(), cache=tmp_path, language="en")
    monkeypatch.undo()
    version = tokenized_module.metadata.version
    monkeypatch.setattr(tokenized_module.metadata, "version", lambda name: "99.0" if name == "nltk" else version(name))
    monkeypatch.setattr(tokenized_module, "tokenize", refuse)  # another nltk: its Treebank rules may have changed
    with pytest.raises(AssertionError, match="tokenized again"):
        tokenized(_records(), cache=tmp_path, language="en")


def test_captions_read_from_disk_load_no_nltk(tmp_path) -> None:
    """Importing nltk loads scipy, most of a second of every training run's start: a run whose
    captions were tokenized before reads them without it."""
    tokenized(_records(), cache=tmp_path, language="en")
    script = ("import sys; from pathlib import Path; from captioning.data.records import ImageRecord; "
              "from captioning.data.tokenized import tokenized; "
              f"read = tokenized([ImageRecord(i, Path(f'{{i}}.png'), raw) for i, raw in enumerate({CAPTIONS!r})], "
              f"cache=Path({str(tmp_path)!r}), language='en'); "
              "print(len(read.words), sorted(name for name in ('nltk', 'scipy') if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split("\n")[-2] == f"{len(tokenized(_records(), cache=None, language='en').words)} []", (
        done.stdout + done.stderr)


def test_a_damaged_file_is_tokenized_again_and_an_unwritable_folder_only_costs_the_tokenizing(tmp_path,
                                                                                               capsys) -> None:
    expected = [[tokenize(c) for c in raw] for raw in CAPTIONS]
    tokenized(_records(), cache=tmp_path, language="en")
    saved = next(tmp_path.glob("*.npz"))
    saved.write_bytes(saved.read_bytes()[:50])
    captions = tokenized(_records(), cache=tmp_path, language="en")
    assert [captions[i] for i in range(4)] == expected
    assert tokenized(_records(), cache=tmp_path, language="en").words == captions.words  # written anew, and readable
    blocked = tmp_path / "a file"
    blocked.write_text("")
    captions = tokenized(_records(), cache=blocked / "tokens", language="en")  # under a file: cannot be made
    assert [captions[i] for i in range(4)] == expected
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith(f"note: {blocked / 'tokens'}: the tokenized captions cannot be kept")


def _held_bytes(captions: int) -> int:
    """Bytes that a split's training pairs hold (tracemalloc), for `captions` captions of 11 words."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(500)]
    raw = [tuple(" ".join(rng.choice(words, size=11)) for _ in range(5)) for _ in range(captions // 5)]
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", *words])
    tracemalloc.start()
    try:
        pairs = CaptionPairs(np.zeros((len(raw), 1, 1), dtype=np.float16), Tokenized.of(raw), vocab)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(pairs) == captions
    return held


def test_training_pairs_hold_arrays_of_about_70_bytes_a_caption_growing_linearly() -> None:
    """As a Python list of (image, ids) pairs they took about 600 bytes a caption, which each
    DataLoader worker came to copy: 566 747 captions on COCO (docs/scale.md)."""
    small, large = _held_bytes(2_000), _held_bytes(8_000)
    assert large / 8_000 < 100
    assert large < 4.4 * small  # linear, up to the words' list and the fixed costs
