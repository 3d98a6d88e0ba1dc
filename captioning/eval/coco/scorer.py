"""What COCO's instances annotations let evaluation say of a split's captions, beside the caption metrics.

- Hallucination, CHAIR (Rohrbach et al., 2018, "Object Hallucination in Image Captioning"): the COCO
  objects a caption names (synonyms.py) against the objects in its image. As in the paper, an
  object is in the image when the instances annotations hold one of its category or a reference
  caption of the image names it (the authors' utils/chair.py reads both). CHAIR_i is the share of
  the object mentions that name an object not in the image, counted as the authors' chair.py counts
  them (every mention: "a dog chasing a dog" names a dog twice); CHAIR_i_once, beside it, counts an
  object once per caption (the sets of the paper's formula). CHAIR_s is the share of captions that
  name at least one such object. Lower is better.
- Attention correctness (Liu et al., 2017) on masks: for each word that names
  an object whose category the instances annotations hold, the share of its map, drawn on the
  image as the encoder saw it (the centre square), inside the union of that category's instance
  masks; its chance level is the masks' share of that square (a uniform map's).

`CocoScorer` is what captioning.eval.evaluate calls, per caption, through its `scorer` seam; the
objects are data (captioning.data.instances), read once per split.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from captioning.data.instances import ImageObjects
from captioning.data.vocab import tokenize
from captioning.eval.coco.synonyms import caption_objects
from captioning.eval.correctness import mask_mass, mask_share


def objects_in_image(truth: ImageObjects, references: Sequence[str]) -> set[str]:
    """The categories CHAIR takes to be in the image: annotated, or named by a reference caption."""
    named = {category for reference in references for _, category in caption_objects(tokenize(reference))}
    return truth.categories | named


def hallucinated(words: Sequence[str], present: set[str]) -> tuple[int, int, int, int]:
    """One caption's CHAIR counts: (mentions of COCO objects, those naming one not in `present`,
    distinct objects named, those not in `present`)."""
    mentions = [category for _, category in caption_objects(words)]
    named = set(mentions)
    return len(mentions), sum(m not in present for m in mentions), len(named), len(named - present)


def correctness_scores(words: Sequence[str], alphas: np.ndarray,
                       truth: ImageObjects) -> tuple[list[float], list[float]]:
    """Per word that names an annotated category: its map's mass inside the category's masks, and
    the chance level. alphas [n_words, Hg, Wg], the map behind each word. Masks are decoded here,
    once per category a caption names, never for the whole split."""
    correct, chance = [], []
    masks: dict[str, np.ndarray] = {}
    annotated = truth.categories
    for position, category in caption_objects(words):
        if category not in annotated:
            continue
        if category not in masks:
            masks[category] = truth.mask(category)  # [height, width] bool
        correct.append(mask_mass(alphas[position], masks[category]))
        chance.append(mask_share(masks[category]))
    return correct, chance


class CocoScorer:
    """CHAIR and attention correctness over one split's captions.

    truths: the split's images' objects in the order their captions come (None: an image that no
    instances file lists, left out); references: their reference captions, as written.
    """

    def __init__(self, truths: Sequence[ImageObjects | None], references: Sequence[Sequence[str]]):
        self.truths, self.references = truths, references
        self.named: list[tuple[int, int, int, int]] = []  # per caption: hallucinated()
        self.correct: list[float] = []
        self.chance: list[float] = []

    def caption(self, index: int, words: Sequence[str], alphas: np.ndarray) -> None:
        """Image `index`'s caption and its maps [n_words, Hg, Wg]."""
        truth = self.truths[index]
        if truth is None:
            return
        self.named.append(hallucinated(words, objects_in_image(truth, self.references[index])))
        correct, chance = correctness_scores(words, alphas, truth)
        self.correct += correct
        self.chance += chance

    def images(self, decoder: torch.nn.Module, annotations: torch.Tensor, start: int) -> None:
        """Nothing to score of the model itself."""

    def absorb(self, other: CocoScorer) -> None:
        """Take in what `other` scored of the images that follow this one's (a split decoded in parts)."""
        self.named += other.named
        self.correct += other.correct
        self.chance += other.chance

    def metrics(self) -> dict[str, float]:
        nan = float("nan")
        mentions, wrong, named, wrong_named = (sum(counts) for counts in zip(*self.named)) if self.named \
            else (0, 0, 0, 0)
        return {"CHAIR_i": wrong / mentions if mentions else nan,  # as the authors' chair.py: every mention
                "CHAIR_i_once": wrong_named / named if named else nan,  # each object once per caption
                "CHAIR_s": float(np.mean([counts[1] > 0 for counts in self.named])) if self.named else nan,
                "CHAIR_objects": mentions,
                "attention_correctness": float(np.mean(self.correct)) if self.correct else nan,
                "attention_correctness_chance": float(np.mean(self.chance)) if self.chance else nan,
                "attention_words": len(self.correct)}
