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
