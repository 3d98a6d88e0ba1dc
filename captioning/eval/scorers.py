"""Which scores a split's dataset adds to the caption metrics (captioning.eval.evaluate's `scorer`):
the shapes data's (its object boxes: captioning.eval.shapes.scorer) or COCO's (its instances
annotations: captioning.eval.coco.scorer); none for a dataset that knows nothing more of its
images."""

from __future__ import annotations

from captioning.data.splits import Split
from captioning.data.vocab import Vocabulary
from captioning.eval.coco.scorer import CocoScorer
from captioning.eval.shapes.scorer import ShapesScorer


def scorer_for(split: Split, vocab: Vocabulary, *, images: int | None = None, start: int = 0,
               probe: bool = True) -> ShapesScorer | CocoScorer | None:
    """The scorer of the split's images start .. `images` (all: None). `probe`: the shapes data's
    relation probe too. COCO's instances files are read the first time a split is scored (and kept
    with it); where they are not there, None (said once, in one line)."""
    if split.scenes is not None:
        return ShapesScorer(split.scenes[start:images], vocab, probe=probe)
    objects = split.instances.objects() if split.instances is not None else None
    if objects is not None:
        return CocoScorer(objects[start:images], split.references[start:images])
    return None
