"""Every caption of a split, tokenized once and held as arrays, and kept on disk for the next run.

On COCO's training split (566 747 captions) the Treebank tokenizer takes most of a minute of a CPU
core, and a run used to pay it twice at start-up (the vocabulary, then the training pairs) and once
more at every resume and every self-critical run; held as Python lists of strings, the tokens take
hundreds of megabytes, and a DataLoader worker that touches them copies the pages it touches
(docs/scale.md measures both). Here the tokens are one int32 array of indices into the distinct
words, with offsets per caption and per image: 4 bytes a token.

The disk copy, DATA_ROOT/tokens/<digest>.npz, is named after what made it: the tokenization's
version (vocab.tokenization of the captions' language, nltk's version) and every raw caption of
every image in order, so a changed caption, image or tokenizer finds no file and tokenizes again.
It is read without pickle. A data root that cannot be written only costs the next run the tokenizing again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import os
import sys
import zipfile
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from captioning import progress
from captioning.config import DataConfig
from captioning.config.choices import ENGLISH
from captioning.data.records import ImageRecord
from captioning.data.vocab import Vocabulary, tokenization, tokenize


class Tokenized(Sequence):
    """The tokens of every caption of a list of images.

    R images, C captions, W tokens in all:
      words      the distinct tokens, in order of first use
      ids        [W] int32: caption c's tokens are words[ids[offsets[c]:offsets[c + 1]]]
      offsets    [C + 1] int64
      first      [R + 1] int64: image r's captions are first[r] .. first[r + 1] - 1
    As a sequence, item r is image r's captions as lists of words (what CIDEr-D reads as references).
    """

    def __init__(self, *, words: list[str], ids: np.ndarray, offsets: np.ndarray, first: np.ndarray):
        self.words, self.ids, self.offsets, self.first = words, ids, offsets, first

    @classmethod
    def of(cls, captions: Sequence[Sequence[str]], *, language: str = ENGLISH) -> Tokenized:
        """Tokenize each image's raw captions, written in `language` (vocab.tokenize)."""
        index: dict[str, int] = {}
        ids: list[int] = []
        offsets, first = [0], [0]
        images = progress.bar(_each_image(captions, language), total=len(captions), desc="tokenizing", unit="image",
                              leave=False)
        for tokens in images:
            for caption in tokens:
                ids += [index.setdefault(token, len(index)) for token in caption]
                offsets.append(len(ids))
            first.append(len(offsets) - 1)
        return cls(words=list(index), ids=np.array(ids, dtype=np.int32), offsets=np.array(offsets, dtype=np.int64),
                   first=np.array(first, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.first) - 1

    def __getitem__(self, image: int) -> list[list[str]]:
        return [self.caption(c) for c in range(self.first[image], self.first[image + 1])]

    def caption(self, c: int) -> list[str]:
        return [self.words[i] for i in self.ids[self.offsets[c]:self.offsets[c + 1]].tolist()]

    @property
    def lengths(self) -> np.ndarray:
        """[C] tokens per caption."""
        return np.diff(self.offsets)

    def counts(self) -> dict[str, int]:
        """How often each word is used, over all captions."""
        return dict(zip(self.words, np.bincount(self.ids, minlength=len(self.words)).tolist()))

    def encoded(self, vocab: Vocabulary, *, max_length: int | None = None,
                words: Callable[[list[str]], list[str]] = list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every caption as vocab.encode gives it (<start> w1 .. wn <end>, at most max_length words), for
        all captions at once: (image of each caption [C], ids [sum of lengths] int32, offsets [C + 1]).
        `words` changes the words before they are looked up; it must map each word on its own
        (data/flips.py swaps left and right), since it is applied to the distinct words."""
        lookup = np.array([vocab.index.get(word, vocab.unk_id) for word in words(self.words)] or [0], dtype=np.int32)
        kept = self.lengths if max_length is None else np.minimum(self.lengths, max_length)  # [C]
        offsets = np.zeros(len(kept) + 1, dtype=np.int32)  # [C + 1]: COCO's 7.3 M tokens fit in int32
        np.cumsum(kept + 2, out=offsets[1:])
        out = np.empty(offsets[-1], dtype=np.int32)
        out[offsets[:-1]] = vocab.start_id
        out[offsets[1:] - 1] = vocab.end_id
        caption = np.repeat(np.arange(len(kept)), kept)  # the caption of each kept word
        place = np.arange(len(caption)) - np.repeat(np.cumsum(kept) - kept, kept)  # its place in the caption
        out[offsets[caption] + 1 + place] = lookup[self.ids[self.offsets[caption] + place]]
        images = np.repeat(np.arange(len(self), dtype=np.int32), np.diff(self.first))
        return images, out, offsets


PARALLEL_FROM = 20_000  # images: fewer tokenize faster in this process than a pool can start
CHUNK = 2_000  # images a task of the pool


def _tokenize_images(captions: Sequence[Sequence[str]], language: str) -> list[list[list[str]]]:
    return [[tokenize(caption, language=language) for caption in raw] for raw in captions]


def _each_image(captions: Sequence[Sequence[str]], language: str) -> Iterator[list[list[str]]]:
    """Each image's captions tokenized, in order. A large split is tokenized by a pool of forked
    processes, one per core (up to 8): the tokenizer is pure Python, and COCO's training captions
    take most of a minute of one core (docs/scale.md)."""
    cores = min(len(os.sched_getaffinity(0)), 8)
    if len(captions) < PARALLEL_FROM or cores < 2 or multiprocessing.current_process().daemon:
        yield from _tokenize_images(captions, language)  # a daemon (a DataLoader worker) may not start processes
        return
    chunks = [captions[i:i + CHUNK] for i in range(0, len(captions), CHUNK)]
    tokenize("", language=language)  # the tokenizer (nltk's, for English) loaded here once, not in each worker
    with multiprocessing.get_context("fork").Pool(cores) as pool:
        for part in pool.imap(functools.partial(_tokenize_images, language=language), chunks):
            yield from part


def tokens_dir(data: DataConfig) -> Path | None:
    """Where a dataset's tokenized captions are kept: beside its feature caches, under
    data.cache_root (data.root where it is not set).
    None (not kept) for a run on its first data.max_images images, as a dry run is: a few images
    tokenize in no time, and a file for each such part would only litter data.root."""
    return Path(data.cache_root or data.root) / "tokens" if data.max_images is None else None


def _digest(captions: Sequence[Sequence[str]], language: str) -> str:
    # nltk's version read from its metadata, not its module: importing nltk loads scipy (about a
    # second), which a run whose captions were tokenized before need not pay (vocab._treebank).
    digest = hashlib.blake2b(f"{tokenization(language)} nltk {metadata.version('nltk')}".encode(), digest_size=16)
    for raw in captions:
        digest.update(("\x1f".join(raw) + "\x1e").encode())
    return digest.hexdigest()


def tokenized(records: Sequence[ImageRecord], *, cache: Path | None, language: str) -> Tokenized:
    """The records' captions, written in `language` (data.language), tokenized: read from
    CACHE/<digest>.npz when an earlier run wrote it, else tokenized here and written there (cache
    None: tokenized, not kept)."""
    captions = [record.captions for record in records]
    path = cache / f"{_digest(captions, language)}.npz" if cache is not None else None
    if path is not None and path.exists():
        try:
            with np.load(path, allow_pickle=False) as saved:
                words = bytes(saved["words"]).decode().split("\n") if saved["words"].size else []
                return Tokenized(words=words, ids=saved["ids"], offsets=saved["offsets"], first=saved["first"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # unreadable (a disk error, a partial copy): tokenize again and write it anew
    result = Tokenized.of(captions, language=language)
    if path is not None:
        _save(path, result)
    return result


def _save(path: Path, value: Tokenized) -> None:
    words = np.frombuffer("\n".join(value.words).encode(), dtype=np.uint8)  # tokens hold no whitespace
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(temporary, words=words, ids=value.ids, offsets=value.offsets, first=value.first)
        os.replace(temporary, path)
    except OSError as error:  # a read-only or full disk: the next run tokenizes again, and is told why
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        print(f"note: {path.parent}: the tokenized captions cannot be kept there ({error.strerror or error}); "
              "the next run tokenizes them again (data.cache_root names a folder that can keep them)",
              file=sys.stderr)
