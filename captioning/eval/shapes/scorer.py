"""What the shapes data knows that real data does not, and the scores it adds to a split's caption metrics.

Every object's box is known (objects.json), so for the captions a model generates:
- attention correctness: for each word that names an object ("circle", or "red circle" when two
  circles are drawn), the share of its map inside that object's box (captioning.eval.correctness);
- hallucination (CHAIR-i and CHAIR-s): shape nouns naming a shape the image does not have;
- stated relations: each "a A <relation> a B" the caption states, checked against the image
  (VERDICTS); a model unsure of positions tends to list the objects instead ("a red circle and a blue
  square"), so this counts few, self-selected relations;
- the relation probe (probe.py), which asks every model the same questions.

Words are linked to objects by reading the caption (the shapes grammar is small and fixed); COCO has
its own linker (captioning.eval.coco). `ShapesScorer` is what captioning.eval.evaluate calls, per
caption and per batch of images, through its `scorer` seam (captioning.eval.evaluate picks it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch

from captioning.data.shapes.scenes import COLOURS, RELATIONS, SHAPES, SIZES, SceneObjects, ShapeObject, relation
from captioning.data.vocab import Vocabulary
from captioning.eval.correctness import box_mass, box_share
from captioning.eval.shapes.probe import ProbeAnswer, probe_scores, relation_probe
from captioning.model.ensemble import Ensemble

# The scores a checkpoint can be picked by (train.val_metric; higher is better) are the config's
# SHAPES_METRICS: ShapesScorer.metrics gives each of them (tests/test_layers.py).


_PHRASE = rf"(?:({'|'.join(SIZES)}) )?({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})"
_RELATION = re.compile(rf"{_PHRASE} ({'|'.join(RELATIONS)}) a {_PHRASE}")


def _find(objects: Sequence[ShapeObject], shape: str, colour: str | None) -> int | None:
    """The object a phrase names: by shape and colour, or by shape alone if that is unambiguous."""
    matches = [i for i, o in enumerate(objects) if o.shape == shape and (colour is None or o.colour == colour)]
    if not matches and colour is not None:
        return _find(objects, shape, None)
    return matches[0] if len(matches) == 1 else None


def word_objects(words: Sequence[str], objects: Sequence[ShapeObject]) -> list[tuple[int, int]]:
    """(word index, object index) for each generated shape noun that names an object in the image."""
    links = []
    for position, word in enumerate(words):
        if word in SHAPES:
            colour = words[position - 1] if position > 0 and words[position - 1] in COLOURS else None
            target = _find(objects, word, colour)
            if target is not None:
                links.append((position, target))
    return links


def named_objects(words: Sequence[str], objects: Sequence[ShapeObject]) -> tuple[int, int]:
    """(shape nouns in the caption, those naming a shape the image does not have): CHAIR's counts
    (Rohrbach et al., 2018), with the four shapes as the object categories."""
    present = {o.shape for o in objects}
    named = [word for word in words if word in SHAPES]
    return len(named), sum(word not in present for word in named)


# What a stated relation "A <relation> B" is, scored against the image: true; wrong (A and B are two
# of its objects, and another relation holds); self (B names A again: "a red circle above a red
# circle"); absent (A or B names no object of the image, or more than one).
VERDICTS = ("true", "wrong", "self", "absent")


def correctness_scores(words: Sequence[str], alphas: np.ndarray,
                     truth: SceneObjects) -> tuple[list[float], list[float], list[str]]:
    """Per named word: attention mass in its box and the chance level; per stated relation: its
    verdict (VERDICTS).

    words: generated words; alphas [n_words, Hg, Wg], the map that generated each word.
    """
    correct, chance = [], []
    for position, target in word_objects(words, truth.objects):
        box = truth.objects[target].box
        correct.append(box_mass(alphas[position], box, width=truth.width, height=truth.height))
        chance.append(box_share(box, width=truth.width, height=truth.height))
    relations = [relation_verdict(a, stated, b, truth.objects)
                 for a, stated, b in stated_relations(words, truth.objects)]
    return correct, chance, relations


def relation_verdict(a: int | None, stated: str, b: int | None, objects: Sequence[ShapeObject]) -> str:
    """The verdict (VERDICTS) on "A <stated> B", A and B as stated_relations finds them."""
    if a is None or b is None:
        return "absent"
    if a == b:  # relation(A, A) would read "to the right of": no offset on either axis
        return "self"
    return "true" if relation(objects[a], objects[b]) == stated else "wrong"


def stated_relations(words: Sequence[str],
                     objects: Sequence[ShapeObject]) -> list[tuple[int | None, str, int | None]]:
    """(A's object index, relation, B's object index) per "a A <relation> a B" in the words; an index
    is None where its phrase names no object of the image, or more than one."""
    found = []
    for match in _RELATION.finditer(" ".join(words)):
        _, colour_a, shape_a, stated, _, colour_b, shape_b = match.groups()
        found.append((_find(objects, shape_a, colour_a), stated, _find(objects, shape_b, colour_b)))
    return found


class ShapesScorer:
    """Attention correctness, stated relations and the relation probe over one split's captions.

    scenes: the split's images' truth, in the order their captions come; `probe`: also run the
    relation probe (it does not depend on the decoding, so a second decoding of the same split need
    not run it again).
    """

    def __init__(self, scenes: Sequence[SceneObjects], vocab: Vocabulary, *, probe: bool = True):
        self.scenes, self.vocab, self.probe = scenes, vocab, probe
        self.correct: list[float] = []
        self.chance: list[float] = []
        self.relations: list[str] = []
        self.named: list[tuple[int, int]] = []  # per caption: (shape nouns, nouns of shapes not in the image)
        self.answers: list[ProbeAnswer] = []

    def caption(self, index: int, words: Sequence[str], alphas: np.ndarray) -> None:
        """Image `index`'s caption and its maps [n_words, Hg, Wg]."""
        correct, chance, relations = correctness_scores(words, alphas, self.scenes[index])
        self.correct += correct
        self.chance += chance
        self.relations += relations
        self.named.append(named_objects(words, self.scenes[index].objects))

    def images(self, decoder: torch.nn.Module, annotations: torch.Tensor, start: int) -> None:
        """The probe on images start .. start + len(annotations); annotations [b, L, D]. An ensemble
        (captioning.model.ensemble) is not probed: the probe scores one decoder's own likelihoods."""
        if self.probe and not isinstance(decoder, Ensemble):
            truths = self.scenes[start:start + annotations.shape[0]]
            self.answers += relation_probe(decoder, annotations, truths, self.vocab)

    def absorb(self, other: ShapesScorer) -> None:
        """Take in what `other` scored of the images that follow this one's (a split decoded in parts)."""
        self.correct += other.correct
        self.chance += other.chance
        self.relations += other.relations
        self.named += other.named
        self.answers += other.answers

    def metrics(self) -> dict[str, float]:
        relations, nan = self.relations, float("nan")
        metrics = {"attention_correctness": float(np.mean(self.correct)) if self.correct else nan,
                   "attention_correctness_chance": float(np.mean(self.chance)) if self.chance else nan,
                   "attention_words": len(self.correct),
                   "relation_accuracy": float(np.mean([v == "true" for v in relations])) if relations else nan,
                   "relations_generated": len(relations)}
        metrics.update({f"relations_{verdict}": relations.count(verdict) for verdict in VERDICTS[1:]})
        # CHAIR: the share of object mentions naming an object not in the image (i), and of captions
        # with at least one such mention (s); lower is better.
        mentions = sum(named for named, _ in self.named)
        metrics["CHAIR_i"] = sum(wrong for _, wrong in self.named) / mentions if mentions else nan
        metrics["CHAIR_s"] = float(np.mean([wrong > 0 for _, wrong in self.named])) if self.named else nan
        if self.probe:
            metrics.update(probe_scores(self.answers))
        return metrics
