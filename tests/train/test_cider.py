"""The CIDEr-D reward against pycocoevalcap's Cider, the independent reference, on the same corpus."""

from __future__ import annotations

import numpy as np
import pytest

from captioning.train.cider import CiderD

REFERENCES = {
    1: ["a red square above a green circle", "a green circle below a red square", "two shapes a square and a circle",
        "a small red square", "a red square over a circle that is green"],
    2: ["a blue triangle", "there is a blue triangle", "a triangle that is blue", "one blue triangle alone",
        "a lone blue triangle on white"],
    3: ["a yellow diamond left of a red circle", "a red circle to the right of a yellow diamond",
        "yellow diamond and red circle", "a diamond and a circle", "a yellow diamond beside a red circle"],
    4: ["a man riding a horse on a beach", "a person rides a horse near the ocean", "horse and rider on the sand",
        "a rider on a brown horse at the beach", "a man on a horse by the water"],
}
CANDIDATES = {1: "a red square above a green circle", 2: "a blue blue blue triangle triangle",
              3: "a red circle", 4: ""}


def _pycocoevalcap(candidates: dict[int, str]) -> np.ndarray:
    from pycocoevalcap.cider.cider import Cider

    _, scores = Cider().compute_score({i: REFERENCES[i] for i in candidates}, {i: [c] for i, c in candidates.items()})
    return np.asarray(scores)


def test_equals_pycocoevalcap_on_the_same_corpus() -> None:
    images = sorted(REFERENCES)
    cider = CiderD([[r.split() for r in REFERENCES[i]] for i in images])
    ours = cider.scores([CANDIDATES[i].split() for i in images], list(range(len(images))))
    np.testing.assert_allclose(ours, _pycocoevalcap(CANDIDATES), rtol=0, atol=1e-6)
    assert ours[0] > 1.0 and ours[3] == 0.0  # a reference itself scores high; nothing scores nothing


@pytest.mark.parametrize("seed", range(5))
def test_equals_pycocoevalcap_on_random_captions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    words = ["a", "the", "red", "green", "blue", "square", "circle", "above", "below", "left", "of", "right",
             "and", "small", "big"]
    images = sorted(REFERENCES)
    candidates = {i: " ".join(rng.choice(words, size=rng.integers(1, 15))) for i in images}
    cider = CiderD([[r.split() for r in REFERENCES[i]] for i in images])
    ours = cider.scores([candidates[i].split() for i in images], list(range(len(images))))
    np.testing.assert_allclose(ours, _pycocoevalcap(candidates), rtol=0, atol=1e-6)


def test_document_frequencies_come_from_the_corpus_not_the_batch() -> None:
    """A reward is the same whichever other captions are scored with it."""
    cider = CiderD([[r.split() for r in REFERENCES[i]] for i in sorted(REFERENCES)])
    alone = cider.scores([["a", "blue", "triangle"]], [1])
    together = cider.scores([["a", "blue", "triangle"], ["a", "red", "square"], ["a", "horse"]], [1, 0, 3])
    assert alone[0] == together[0]


def test_an_epoch_of_rewards_keeps_no_reference_vectors_between_batches():
    """SCST scores a batch of images a step; an image's reference vectors live for its own call only.
    Kept for every image an epoch touches, they grew to 2.8 GB on COCO's training split (docs/scale.md);
    here 2 000 images of five 11-word references kept 50 MB."""
    import tracemalloc

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    references = [[list(rng.choice(words, size=11)) for _ in range(5)] for _ in range(2000)]
    cider = CiderD(references)
    tracemalloc.start()
    try:
        cider.scores([references[0][0]] * 64, list(range(64)))
        settled = tracemalloc.get_traced_memory()[0]
        for first in range(64, 2000, 64):
            rows = list(range(first, min(first + 64, 2000)))
            cider.scores([references[i][1] for i in rows], rows)
        grown = tracemalloc.get_traced_memory()[0] - settled
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000, f"{grown / 1e6:.1f} MB kept after scoring every image once"


def test_the_store_keeps_only_n_grams_that_more_than_one_image_uses():
    """An n-gram of one image has log(df) = log(1) = 0, as one of none: on COCO most 3- and 4-grams
    are such, and keeping them took the store over 1 GB. Counted here by hand: the n-grams (1 to 4)
    of the four images' references, and those used by at least two images."""
    references = [[r.split() for r in REFERENCES[i]] for i in sorted(REFERENCES)]
    used_by: dict[tuple[str, ...], set[int]] = {}
    for image, refs in enumerate(references):
        for ref in refs:
            for k in range(1, 5):
                for i in range(len(ref) - k + 1):
                    used_by.setdefault(tuple(ref[i:i + k]), set()).add(image)
    shared = {gram: len(images) for gram, images in used_by.items() if len(images) > 1}
    assert 0 < len(shared) < len(used_by) // 4  # most n-grams are one image's
    cider = CiderD(references)
    assert cider.log_df == pytest.approx({gram: np.log(count) for gram, count in shared.items()})
