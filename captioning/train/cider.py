"""CIDEr-D as a reward (Vedantam et al., 2015; self-critical training, Rennie et al., 2017).

The same numbers as pycocoevalcap's Cider (which is CIDEr-D: clipped term frequencies, a Gaussian
length penalty with sigma 6, times 10), with one difference of purpose: the document frequencies
come from a fixed corpus, the training references, counted once, instead of from the captions being
scored, so that a sample's reward does not depend on the other samples of its batch. An image's
reference vectors are computed once for a batch (its K samples and its greedy caption share them:
the last call's are kept for the next) and no longer: kept for every image an epoch touches, they
grew to 2.8 GB on COCO's training split (docs/scale.md). A candidate costs one tf-idf vector and a
sparse product per reference. Given the same corpus as pycocoevalcap's (the references being
scored), `scores` equals its per-image CIDEr (tests/train/test_cider.py).

Captions are lists of tokens. As in pycocoevalcap, a caption's "length" for the penalty is its
number of bigrams.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

Tokens = Sequence[str]
Vector = tuple[list[dict[tuple[str, ...], float]], list[float], int]  # tf-idf per n, their norms, length


def grams(tokens: Tokens, k: int) -> list[tuple[str, ...]]:
    """The k-grams of a caption, in order."""
    return [tuple(tokens[i:i + k]) for i in range(len(tokens) - k + 1)]


def ngram_counts(tokens: Tokens, n: int = 4) -> Counter:
    return Counter(gram for k in range(1, n + 1) for gram in grams(tokens, k))


class CiderD:
    """CIDEr-D of candidates against the references of a corpus of images (one list of token lists each)."""

    def __init__(self, references: Sequence[Sequence[Tokens]], *, n: int = 4, sigma: float = 6.0):
        self.n, self.sigma = n, sigma
        self.references = references
        # log(df) of each n-gram, where df counts the images whose references use it (once per image,
        # however many of its references do). An n-gram of one image only has log(1) = 0, the value of
        # one no image uses, so it is not kept: on COCO most 3- and 4-grams are such (docs/scale.md).
        # One n at a time, so that set-up holds one order's counts at once.
        self.log_df: dict[tuple[str, ...], float] = {}
        for k in range(1, n + 1):
            frequency: Counter = Counter()
            for refs in references:
                frequency.update({gram for ref in refs for gram in grams(ref, k)})
            self.log_df.update((gram, math.log(count)) for gram, count in frequency.items() if count > 1)
            del frequency
        self.log_docs = math.log(float(len(references)))
        self._recent: dict[int, list[Vector]] = {}  # the reference vectors of the last call's images

    def vector(self, tokens: Tokens) -> Vector:
        vec: list[dict[tuple[str, ...], float]] = [{} for _ in range(self.n)]
        norms = [0.0] * self.n
        length = 0
        for gram, count in ngram_counts(tokens, self.n).items():
            k = len(gram) - 1
            weight = count * (self.log_docs - self.log_df.get(gram, 0.0))  # log(max(1, df)): 0 for an unseen n-gram
            vec[k][gram] = weight
            norms[k] += weight * weight
            if k == 1:
                length += count  # bigrams, as pycocoevalcap counts a caption's length
        return vec, [math.sqrt(x) for x in norms], length

    def reference_vectors(self, image: int) -> list[Vector]:
        return [self.vector(ref) for ref in self.references[image]]

    def score(self, candidate: Tokens, image: int, refs: list[Vector] | None = None) -> float:
        """CIDEr-D of one candidate against image `image`'s references (`refs`: their vectors, if at hand)."""
        vec, norms, length = self.vector(candidate)
        refs = refs if refs is not None else self.reference_vectors(image)
        total = 0.0
        for ref_vec, ref_norms, ref_length in refs:
            penalty = math.exp(-((length - ref_length) ** 2) / (2 * self.sigma ** 2))
            for k in range(self.n):
                dot = sum(min(weight, ref_vec[k].get(gram, 0.0)) * ref_vec[k].get(gram, 0.0)
                          for gram, weight in vec[k].items())
                if norms[k] != 0 and ref_norms[k] != 0:
                    dot /= norms[k] * ref_norms[k]
                total += dot * penalty
        return total / self.n / len(refs) * 10.0

    def scores(self, candidates: Sequence[Tokens], images: Sequence[int]) -> np.ndarray:
        """CIDEr-D of candidates[i] against the references of images[i]: [N]. Each image's reference
        vectors are computed once for all of its candidates, or taken from the call before (the same
        batch's samples, then its greedy captions)."""
        recent = self._recent
        self._recent = {i: recent[i] if i in recent else self.reference_vectors(i) for i in dict.fromkeys(images)}
        return np.array([self.score(c, i, self._recent[i]) for c, i in zip(candidates, images)], dtype=np.float64)
