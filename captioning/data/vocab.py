"""Caption normalization, tokenization and the word vocabulary.

Training targets and evaluation references go through the same `tokenize`, so a word is the same
word on both sides. Captions are tokenized by their language (data.language): English by nltk's
Treebank rules, which are rule-based and need no data download; any other language by Unicode word
characters, since the Treebank's clitics and quotes are English's.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from captioning.config.choices import ENGLISH
from captioning.model.tokens import END_ID, PAD_ID, SPECIALS, START_ID, UNK_ID
from captioning.runtime.files import replace_text


@functools.cache
def _treebank():
    """nltk's Treebank tokenizer, imported at the first English caption: importing nltk takes most of
    a second (it loads scipy), which captioning an image, with no caption to read, need not pay."""
    from nltk.tokenize import TreebankWordTokenizer

    return TreebankWordTokenizer()


# Typographic quotes as typed by people (and word processors): made straight, so "dog’s" is "dog's".
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u2032": "'", "\u00b4": "'",
                         "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"'})
_PUNCTUATION = re.compile(r"^[^\w]+$")


def normalize(caption: str) -> str:
    """NFKC, straight quotes, lower case, single spaces: '  A “Big”\tDog. ' -> 'a "big" dog.'."""
    text = unicodedata.normalize("NFKC", caption).translate(_QUOTES).lower()
    return " ".join(text.split())


_CLITICS = {"'s", "'re", "'ll", "'d", "'m", "'ve"}


def _unquote(token: str) -> str:
    """Treebank splits off a closing single quote but not an opening one: "'here" -> "here", "'s" stays."""
    return token if token in _CLITICS or not token.startswith("'") else token.lstrip("'")


# Names what `tokenize` gives in each language: change it whenever its output changes, since
# tokenized captions are kept on disk under a name made from it (data/tokenized.py).
TOKENIZATION = "treebank, NFKC, straight quotes, lower case, no punctuation: 1"
WORD_TOKENIZATION = "unicode words, NFKC, straight quotes, lower case, no punctuation: 1"


def tokenization(language: str) -> str:
    """What `tokenize(..., language=language)` is, by name."""
    return TOKENIZATION if language == ENGLISH else WORD_TOKENIZATION


def tokenize(caption: str, *, language: str = ENGLISH) -> list[str]:
    """Lower-cased word tokens without punctuation, in the caption's language:
    'A red, round Circle.' -> [a, red, round, circle];
    'Zwei Hunde rennen über die Straße.' (de) -> [zwei, hunde, rennen, über, die, straße]."""
    if language != ENGLISH:
        return words(caption)
    tokens = (_unquote(token) for token in _treebank().tokenize(normalize(caption)))
    return [token for token in tokens if token and not _PUNCTUATION.match(token)]


_JOINERS = "'-"  # inside a word they join it ("t-shirt", "geht's"); at its ends they are punctuation


def _in_word(character: str) -> bool:
    # letters and digits of any script, the marks that sit on them (a vowel sign of Devanagari, an
    # accent NFKC found nothing to compose with) and the joiners
    return character.isalnum() or unicodedata.category(character)[0] == "M" or character in _JOINERS


def words(caption: str) -> list[str]:
    """The words of a caption in any language: runs of letters, digits and their marks, joined inside
    by an apostrophe or a hyphen, lower-cased as Unicode lowers them (Ä -> ä; ß stays ß, which a
    case fold would make ss). NFKC first, so an umlaut typed as a + a combining diaeresis is one
    letter: 'Ein T-Shirt, grün.' -> [ein, t-shirt, grün]."""
    text = "".join(c if _in_word(c) else " " for c in normalize(caption))
    return [word for word in (token.strip(_JOINERS) for token in text.split()) if word]


class Vocabulary:
    """Words <-> ids; ids 0..3 are <pad>, <start>, <end>, <unk>."""

    def __init__(self, words: Sequence[str]):
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}")
        self.words = list(words)
        self.index = {word: i for i, word in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise ValueError("a vocabulary cannot hold the same word twice")

    pad_id, start_id, end_id, unk_id = PAD_ID, START_ID, END_ID, UNK_ID  # captioning.model.tokens

    @classmethod
    def build(cls, captions: Iterable[Sequence[str]], min_count: int = 1) -> Vocabulary:
        """From tokenized training captions; words seen fewer than min_count times become <unk>."""
        return cls.from_counts(Counter(token for caption in captions for token in caption), min_count=min_count)

    @classmethod
    def from_counts(cls, counts: dict[str, int], min_count: int = 1) -> Vocabulary:
        """From each word's count over the training captions (Tokenized.counts)."""
        kept = sorted(word for word, count in counts.items() if count >= min_count)
        return cls(list(SPECIALS) + kept)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: Sequence[str], max_length: int | None = None) -> list[int]:
        """<start> w1 .. wn <end>, with at most max_length words (clipping training targets only)."""
        ids = [self.index.get(token, self.unk_id) for token in tokens]
        if max_length is not None:
            ids = ids[:max_length]
        return [self.start_id, *ids, self.end_id]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words up to the first <end>, without special tokens."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.end_id:
                break
            if i in (self.pad_id, self.start_id):
                continue
            words.append(self.words[i])
        return words

    def save(self, path: str | Path) -> None:
        """Written whole or not at all (a temporary file, then a rename): a kill never leaves half a list."""
        replace_text(Path(path), json.dumps(self.words, indent=0))

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        return cls(json.loads(Path(path).read_text()))
