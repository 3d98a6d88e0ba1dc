"""COCO's CHAIR and attention correctness on instance masks, each number against a hand count.

CHAIR (Rohrbach et al., 2018): the objects a caption names that are not in its image (annotated, or
named by a reference caption), over the objects it names (CHAIR_i), and the captions with one
(CHAIR_s); an object counts once per caption. SceneObjects: a word's map, drawn on the centre square
the encoder saw, inside its category's masks, against that square's share of the masks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from captioning.data.instances import ImageObjects, Instances
from captioning.data.records import ImageRecord
from captioning.data.splits import Split
from captioning.data.vocab import Vocabulary
from captioning.eval.coco.scorer import CocoScorer
from captioning.eval.evaluate import scorer_for
from captioning.model.tokens import SPECIALS

# A wide image, 8 x 4: the encoder saw its centre square, columns 2-5. A dog over columns 0-2 (one
# of them, column 2, in the square) and a person over columns 5-7 (column 5 in the square).
DOG = [0, 0, 3, 0, 3, 4, 0, 4]
PERSON = [5, 0, 8, 0, 8, 4, 5, 4]
WIDE = ImageObjects(8, 4, (("dog", [DOG]), ("person", [PERSON])))
PERSON_ON_MOTORCYCLE = ImageObjects(8, 4, (("person", [PERSON]), ("motorcycle", [DOG])))


def _words(caption: str) -> list[str]:
    return caption.split()


def _uniform(words: list[str], grid: int = 4) -> np.ndarray:
    return np.full((len(words), grid, grid), 1 / grid ** 2)  # [n_words, Hg, Wg]


def _score(*captions: tuple[str, ImageObjects, list[str]]) -> dict[str, float]:
    """CocoScorer's metrics of captions (caption, the image's objects, its references), uniform maps."""
    scorer = CocoScorer([truth for _, truth, _ in captions], [references for _, _, references in captions])
    for index, (caption, _, _) in enumerate(captions):
        scorer.caption(index, caption.split(), _uniform(caption.split()))
    return scorer.metrics()


def test_chair_a_man_riding_a_motorbike_next_to_a_dog() -> None:
    """person, motorcycle, dog named; person and motorcycle in the image: CHAIR_i 1/3, CHAIR_s 1."""
    metrics = _score(("a man riding a motorbike next to a dog", PERSON_ON_MOTORCYCLE, ["a person on a motorcycle"]))
    assert metrics["CHAIR_i"] == pytest.approx(1 / 3) and metrics["CHAIR_s"] == 1.0
    assert metrics["CHAIR_objects"] == 3


def test_chair_reads_a_two_word_phrase_as_one_object() -> None:
    """"a dog eating a hot dog" on an image of a dog: the hot dog is hallucinated (1 of 2), not a
    second dog; "a teddy bear on a bed" on an image of both: no bear hallucinated (0 of 2).
    CHAIR_i 1/4, CHAIR_s 1/2."""
    teddy = ImageObjects(8, 4, (("teddy bear", [DOG]), ("bed", [PERSON])))
    metrics = _score(("a dog eating a hot dog", WIDE, ["a dog"]), ("a teddy bear on a bed", teddy, ["a toy"]))
    assert metrics["CHAIR_i"] == pytest.approx(1 / 4) and metrics["CHAIR_s"] == pytest.approx(1 / 2)


def test_chair_reads_plurals() -> None:
    """"two dogs and three women": a dog and a person named, both in the image: 0 of 2."""
    metrics = _score(("two dogs and three women", WIDE, ["animals"]))
    assert metrics["CHAIR_objects"] == 2 and metrics["CHAIR_i"] == 0.0 and metrics["CHAIR_s"] == 0.0


def test_chair_counts_every_mention_as_the_authors_do_and_once_per_caption_beside_it() -> None:
    """"a dog chasing a dog near a cat" on an image of a cat: three mentions, two of a dog that is not
    there (the authors' chair.py: CHAIR_i 2/3); {dog, cat} named once each (CHAIR_i_once 1/2)."""
    cat = ImageObjects(8, 4, (("cat", [DOG]),))
    metrics = _score(("a dog chasing a dog near a cat", cat, ["a cat"]))
    assert metrics["CHAIR_i"] == pytest.approx(2 / 3) and metrics["CHAIR_objects"] == 3
    assert metrics["CHAIR_i_once"] == pytest.approx(1 / 2)


def test_chair_on_a_toy_set_against_a_hand_count() -> None:
    """Three captions of images holding a dog only. Mentions (the authors' count): "a cat chases a cat
    near a cat" 3, all wrong; "a dog" 1, right; "a dog and a dog and a bird" 3, the bird wrong: 4 wrong
    of 7. Once per caption: {cat} 1 wrong of 1, {dog} 0 of 1, {dog, bird} 1 of 2: 2 of 4. Two of the
    three captions name something absent."""
    dog = ImageObjects(8, 4, (("dog", [DOG]),))
    metrics = _score(("a cat chases a cat near a cat", dog, ["a dog"]), ("a dog", dog, ["a dog"]),
                     ("a dog and a dog and a bird", dog, ["a dog"]))
    assert metrics["CHAIR_i"] == pytest.approx(4 / 7) and metrics["CHAIR_objects"] == 7
    assert metrics["CHAIR_i_once"] == pytest.approx(2 / 4)
    assert metrics["CHAIR_s"] == pytest.approx(2 / 3)


def test_chair_takes_an_object_a_reference_names_to_be_in_the_image() -> None:
    """As the paper: the couch is not annotated, but a reference names a sofa."""
    cat = ImageObjects(8, 4, (("cat", [DOG]),))
    assert _score(("a cat on a couch", cat, ["a cat sleeping on a sofa"]))["CHAIR_i"] == 0.0
    assert _score(("a cat on a couch", cat, ["a cat sleeping"]))["CHAIR_i"] == pytest.approx(1 / 2)


def test_attention_correctness_inside_the_masks_of_the_centre_square() -> None:
    """"a dog and a man with a ball and a cat" on WIDE, 4 x 4 maps (the square's own size: drawn as
    they are). The dog's map: 0.5 at column 0 of the square (image column 2, in the dog's mask) and
    0.5 at column 1 (image column 3, outside): 0.5. The man's: all at column 3 (image column 5, the
    person's): 1. The ball (a reference's, not annotated) and the cat (not in the image) have no
    mask. Chance: each mask holds 1 of the square's 4 columns, 0.25 (of the whole image: 3 of 8)."""
    words = _words("a dog and a man with a ball and a cat")
    alphas = _uniform(words)
    alphas[1] = 0.0
    alphas[1, 0, 0] = alphas[1, 0, 1] = 0.5
    alphas[4] = 0.0
    alphas[4, 3, 3] = 1.0
    scorer = CocoScorer([WIDE], [["a dog plays with a ball"]])
    scorer.caption(0, words, alphas)
    metrics = scorer.metrics()
    assert metrics["attention_words"] == 2
    assert metrics["attention_correctness"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["attention_correctness_chance"] == pytest.approx(0.25)
    assert metrics["CHAIR_i"] == pytest.approx(1 / 4)  # dog, person, sports ball, cat: the cat


def test_absorbing_a_second_part_gives_the_whole_split_s_scores() -> None:
    """By hand: {person, motorcycle, dog} with the dog hallucinated; {dog, person}; {cat, bed}, both
    hallucinated: CHAIR_i 3/7, CHAIR_s 2/3."""
    captions = [("a man riding a motorbike next to a dog", PERSON_ON_MOTORCYCLE, ["a man"]),
                ("a dog and a man", WIDE, ["a dog"]), ("two cats on a bed", WIDE, ["a dog and a man"])]
    rng = np.random.default_rng(0)
    maps = [rng.dirichlet(np.ones(16), size=len(c.split())).reshape(-1, 4, 4) for c, _, _ in captions]

    def scored(rows: range) -> CocoScorer:
        scorer = CocoScorer([captions[i][1] for i in rows], [captions[i][2] for i in rows])
        for index, row in enumerate(rows):
            scorer.caption(index, captions[row][0].split(), maps[row])
        return scorer

    whole = scored(range(3)).metrics()
    first = scored(range(0, 1))
    first.absorb(scored(range(1, 3)))
    parts = first.metrics()
    assert whole.keys() == parts.keys() and whole["attention_words"] == 4  # man, motorbike; dog, man
    for name, value in whole.items():
        assert parts[name] == pytest.approx(value), name
    assert whole["CHAIR_i"] == pytest.approx(3 / 7) and whole["CHAIR_s"] == pytest.approx(2 / 3)


def test_an_image_in_no_instances_file_is_not_scored() -> None:
    scorer = CocoScorer([None, WIDE], [["a dog"], ["a dog"]])
    scorer.caption(0, ["a", "cat"], _uniform(["a", "cat"]))
    scorer.caption(1, ["a", "dog"], _uniform(["a", "dog"]))
    assert scorer.metrics()["CHAIR_i"] == 0.0 and scorer.metrics()["attention_words"] == 1


def _split(instances: Instances | None) -> Split:
    records = [ImageRecord(i, Path(f"{i}.jpg"), (f"caption {i}",)) for i in (1, 2, 3)]
    return Split("val", records, None, None, None, instances=instances)


def test_scorer_for_picks_coco_s_scorer_for_its_part_of_the_split(tmp_path: Path, capsys) -> None:
    vocab = Vocabulary(SPECIALS)
    assert scorer_for(_split(None), vocab) is None
    absent = _split(Instances([tmp_path / "none.json"], [1, 2, 3]))
    assert scorer_for(absent, vocab) is None and scorer_for(absent, vocab, start=1) is None
    assert len(capsys.readouterr().err.splitlines()) == 1  # said once, however often asked
    (tmp_path / "val.json").write_text(json.dumps({
        "images": [{"id": i, "width": 8, "height": 4} for i in (1, 2, 3)],
        "annotations": [{"id": 1, "image_id": 3, "category_id": 18, "segmentation": [DOG], "iscrowd": 0}],
        "categories": [{"id": 18, "name": "dog"}]}))
    scorer = scorer_for(_split(Instances([tmp_path / "val.json"], [1, 2, 3])), vocab, images=3, start=1)
    assert isinstance(scorer, CocoScorer) and scorer.references == [("caption 2",), ("caption 3",)]
    assert scorer.truths[0].objects == () and scorer.truths[1].categories == {"dog"}
    assert capsys.readouterr().err == ""


def test_no_caption_scored_is_nan_not_zero() -> None:
    metrics = CocoScorer([], []).metrics()
    assert all(math.isnan(metrics[name]) for name in ("CHAIR_i", "CHAIR_s", "attention_correctness"))
    assert metrics["attention_words"] == 0
