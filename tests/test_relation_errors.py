"""benchmarks/relation_errors.py splits the relation probe's answers by each pair's geometry: its rows
must be the probe's pairs, in the probe's order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from captioning import probe
from captioning.data.shapes import RELATIONS, Grounding, ShapeObject


@pytest.fixture()
def relation_errors(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import relation_errors

    return relation_errors


def scene(rng: np.random.Generator, count: int) -> Grounding:
    objects = []
    for k in range(count):
        x, y = rng.uniform(20, 200, size=2)
        objects.append(ShapeObject("circle", ("red", "blue", "green")[k], "small", (x - 8, y - 8, x + 8, y + 8)))
    return Grounding(objects, 224, 224)


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
    truth = Grounding([left, right, top], 224, 224)

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
    from test_glimpses import T, make_decoder, make_inputs

    decoder = make_decoder(seed=3)
    annotations, tokens = make_inputs(seed=4)
    one, words = annotations[:1], tokens[0]
    steps = relation_errors.teacher_forced(decoder, one, words, T)
    seconds: list[torch.Tensor] = []
    hook = decoder.glimpse.register_forward_hook(lambda module, inputs, output: seconds.append(output.alpha))
    with torch.no_grad():
        output = decoder(one, words[None])
    hook.remove()
    assert len(steps) == len(seconds) == T
    for k, (logits, maps) in enumerate(steps):
        torch.testing.assert_close(logits, output.logits[0, k])
        torch.testing.assert_close(maps["first"], output.alphas[0, k])
        torch.testing.assert_close(maps["second"], seconds[k][0])
    assert not torch.allclose(steps[2][1]["first"], steps[2][1]["second"])  # two maps, not one twice
    assert decoder.glimpse._forward_hooks == {}  # teacher_forced left no hook behind
