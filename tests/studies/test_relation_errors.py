"""The relations study's error analysis (studies/relations/errors.py) splits the relation probe's
answers by each pair's geometry: its rows must be the probe's pairs, in the probe's order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.data.shapes.scenes import RELATIONS, SceneObjects, ShapeObject
from captioning.eval.shapes import probe

pytestmark = pytest.mark.study


@pytest.fixture()
def relation_errors():
    from studies.relations import errors

    return errors


def scene(rng: np.random.Generator, count: int) -> SceneObjects:
    objects = []
    for k in range(count):
        x, y = rng.uniform(20, 200, size=2)
        objects.append(ShapeObject("circle", ("red", "blue", "green")[k], "small", (x - 8, y - 8, x + 8, y + 8)))
    return SceneObjects(objects, 224, 224)


def test_pair_geometry_follows_the_probes_pairs(relation_errors, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    truths = [scene(rng, count) for count in (3, 1, 2, 3, 3, 2)]
    monkeypatch.setattr(probe, "relation_log_likelihoods",
                        lambda decoder, annotations, pairs, vocab: (torch.zeros(len(pairs), 4),) * 2)
    answers = probe.relation_probe(None, torch.zeros(len(truths), 4, 6), truths, None)
    geometry = relation_errors.pair_geometry(truths)
    assert len(geometry) == len(answers) == 6 + 0 + 2 + 6 + 6 + 2
    # The relation's axis is horizontal exactly where |dx| >= |dy|, i.e. where the margin is >= 0;
    # the object counts run image by image.
    horizontal = [relation_errors.HORIZONTAL[a.truth] for a in answers]
    assert [margin >= 0 for margin, _ in geometry] == horizontal
    assert [count for _, count in geometry] == [3] * 6 + [2] * 2 + [3] * 12 + [2] * 2
    assert {RELATIONS[a.truth] for a in answers} == set(RELATIONS)  # the scenes exercise every relation


def test_verdict_causes_tell_a_wrong_relation_word_from_a_wrong_b(relation_errors) -> None:
    """A false "A <relation> B" is the relation word's fault when no object lies that way of A, and
    B's when one does; an absent phrase says whether it was A or B."""
    left = ShapeObject("circle", "red", "small", (10, 100, 30, 120))  # centre (20, 110)
    right = ShapeObject("square", "blue", "small", (190, 100, 210, 120))  # (200, 110): right of left
    top = ShapeObject("circle", "green", "small", (100, 0, 120, 20))  # (110, 10): above both
    truth = SceneObjects([left, right, top], 224, 224)

    def causes(text: str) -> list[tuple[str, str | None]]:
        return relation_errors.verdict_causes(text.split(), truth)

    assert causes("a red circle to the left of a blue square") == [("true", None)]
    # Above the red circle lies nothing: whatever B had been, the relation word was wrong.
    assert causes("a red circle above a blue square") == [("wrong", "no object that way")]
    assert causes("a red circle above a red circle") == [("self", "no object that way")]
    # relation(A, A) reads "to the right of" (no offset): A itself is no object that way.
    assert causes("a red circle to the right of a red circle") == [("self", "no object that way")]
    assert causes("a blue square to the left of a green circle") == [("wrong", "no object that way")]
    # The red circle is below the green one: the relation word held, and B named another object.
    assert causes("a red circle below a blue square") == [("wrong", "another object that way")]
    assert causes("a red circle below a red circle") == [("self", "another object that way")]
    assert causes("a blue square to the right of a green circle") == [("wrong", "another object that way")]
    # A phrase names no object: a shape the image lacks, or a colour that picks neither circle.
    assert causes("a green triangle above a red circle") == [("absent", "A names none")]
    assert causes("a yellow circle below a blue square") == [("absent", "A names none")]
    assert causes("a red circle below a yellow diamond") == [("absent", "B names none")]
    # Two relations in one caption: one verdict and cause each, in order.
    assert causes("a green circle above a red circle and a red circle above a blue square") == [
        ("true", None), ("wrong", "no object that way")]


def test_teacher_forced_steps_match_the_decoders_forward_pass(relation_errors) -> None:
    """The per-step logits and maps the breakdowns read are those of the decoder's own teacher-forced
    pass (which runs every step of the batch at once), step for step, for both glimpses."""
    from tests.model.extras.test_glimpses import T, make_decoder, make_inputs

    decoder = make_decoder(seed=3)
    annotations, tokens = make_inputs(seed=4)
    one, words = annotations[:1], tokens[0]
    steps = relation_errors.teacher_forced(decoder, one, words, T)
    seen: dict[str, list[torch.Tensor]] = {"first": [], "second": []}
    hooks = [module.register_forward_hook(lambda module, inputs, output, name=name: seen[name].append(output.alpha))
             for name, module in (("first", decoder.attention.first), ("second", decoder.attention.second))]
    with torch.no_grad():
        output = decoder(one, words[None])
    for hook in hooks:
        hook.remove()
    assert len(steps) == len(seen["first"]) == len(seen["second"]) == T
    for k, (logits, maps) in enumerate(steps):
        torch.testing.assert_close(logits, output.logits[0, k])
        torch.testing.assert_close(maps["first"], seen["first"][k][0])  # each glimpse's own map, not the mean
        torch.testing.assert_close(maps["second"], seen["second"][k][0])
        torch.testing.assert_close((maps["first"] + maps["second"]) / 2, output.alphas[0, k])  # what it reports
    assert not torch.allclose(steps[2][1]["first"], steps[2][1]["second"])  # two maps, not one twice
    # teacher_forced left no hook behind
    assert decoder.attention.first._forward_hooks == {} and decoder.attention.second._forward_hooks == {}


def test_binding_reads_the_map_that_predicts_the_first_objects_shape(relation_errors, monkeypatch) -> None:
    """Per reference caption whose first object A shares its shape with another object (its twin): the
    map at the step fed A's colour, which predicts A's shape, inside A and inside the twin."""
    from types import SimpleNamespace

    from captioning.data.vocab import Vocabulary

    red = ShapeObject("square", "red", "small", (0, 0, 56, 56))  # grid cell (0, 0) of a 4 x 4 grid
    yellow = ShapeObject("square", "yellow", "small", (168, 168, 224, 224))  # cell (3, 3)
    blue = ShapeObject("circle", "blue", "small", (168, 0, 224, 56))  # cell (0, 3)
    references = ("a red square to the left of a yellow square",  # A red, twin yellow: the map on A
                  "a yellow square to the right of a red square",  # A yellow, twin red: the map on the twin
                  "a blue circle above a yellow square")  # A has no twin: not counted
    images = SimpleNamespace(records=[None], scenes=[SceneObjects([red, yellow, blue], 224, 224)],
                             references=[references], annotations=np.zeros((1, 16, 4), dtype=np.float32),
                             grid=(4, 4))
    vocab = Vocabulary.build([caption.split() for caption in references])
    run = relation_errors.Run(Path("ckpt.pt"), "test", None, vocab, images)

    def one_hot(cell: int) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.tensor(cell), 16).float()

    cells = {"red": 0, "yellow": 15, "blue": 3}  # the grid cell inside each colour's object

    def teacher_forced(decoder, annotations, tokens, steps):
        # A map on the object of the colour the step was fed, and elsewhere on the background (cell 5):
        # only the step fed A's colour finds A.
        return [(torch.zeros(len(vocab)), {"first": one_hot(cells.get(vocab.words[int(tokens[k])], 5))})
                for k in range(steps)]

    monkeypatch.setattr(relation_errors, "teacher_forced", teacher_forced)
    [line] = relation_errors.binding_breakdown(run, images=1)
    inside = relation_errors.box_mass(one_hot(0).view(4, 4).numpy(), red.box, width=224, height=224)
    assert inside > 0.3  # the map, drawn smooth on the image, keeps much of its mass in the cell's box
    assert (f"2 captions whose first object A shares its shape with another (its twin), at the step that "
            f"predicts A's shape: map inside A {inside:.3f}, inside its twin 0.000; more on A than on the twin "
            "in 100%") in line


def test_stated_relations_are_split_by_whether_two_objects_share_a_shape(relation_errors,
                                                                                    tmp_path) -> None:
    from types import SimpleNamespace

    left_red = ShapeObject("square", "red", "small", (10, 100, 30, 120))
    right_yellow = ShapeObject("square", "yellow", "small", (190, 100, 210, 120))  # the red one's twin
    right_blue = ShapeObject("circle", "blue", "small", (190, 100, 210, 120))
    twins, distinct = SceneObjects([left_red, right_yellow], 224, 224), SceneObjects([left_red, right_blue], 224, 224)
    images = SimpleNamespace(image_ids=[7, 8, 9], scenes=[twins, distinct, distinct])
    run = relation_errors.Run(Path("ckpt.pt"), "test", None, None, images)
    stated = {7: "a red square to the right of a red square",  # self: the red square's twin's relation
              8: "a red square to the left of a blue circle",
              9: "a blue circle to the right of a red square and a red square to the right of a blue circle"}
    lines = relation_errors.caption_breakdown(tmp_path / "captions.json", stated, run=run)
    assert "  2 objects:    4 stated, 50% true; true 2, wrong 1, self 1, absent 0" in lines
    assert "    where two of them share a shape: 1 stated, 0% true" in lines
    assert "    where no two share a shape: 3 stated, 67% true" in lines
    assert "  3 objects:    0 stated, nan% true; true 0, wrong 0, self 0, absent 0" in lines
    assert "    where no two share a shape: 0 stated, none" in lines
    assert lines[-1] == ("  by the relation stated (true of stated): to the left of 1 of 1, to the right of 1 of 3, "
                         "above 0 of 0, below 0 of 0")


def test_pair_twins_follow_the_probes_pairs(relation_errors) -> None:
    def shape(kind: str, colour: str, x: float) -> ShapeObject:
        return ShapeObject(kind, colour, "small", (x, 100, x + 16, 116))

    twins = SceneObjects([shape("circle", "red", 10), shape("circle", "blue", 100)], 224, 224)  # the same shape
    colours = SceneObjects([shape("circle", "red", 10), shape("square", "blue", 60), shape("diamond", "red", 150)],
                        224, 224)  # two reds, no two shapes alike
    distinct = SceneObjects([shape("circle", "red", 10), shape("square", "blue", 100)], 224, 224)
    alone = SceneObjects([shape("circle", "red", 10)], 224, 224)
    scenes = [twins, alone, colours, distinct]
    assert relation_errors.pair_twins(scenes) == [True] * 2 + [False] * 6 + [False] * 2
    assert len(relation_errors.pair_twins(scenes)) == len(relation_errors.pair_geometry(scenes))
