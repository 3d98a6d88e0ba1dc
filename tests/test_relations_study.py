"""benchmarks/relations.py's bookkeeping: which data a run trains on, and the table after runs side by side."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MIX_SEED0 = "soft_local_layout_glimpses_coordinates_16ep_by_probe_words3_patience3_objects123_seed0"
MIX_SEED1 = MIX_SEED0.replace("_seed0", "_seed1")


@pytest.fixture
def relations(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import relations

    return relations


def test_a_run_on_another_mix_of_scenes_makes_its_own_data_beside_the_default(relations, monkeypatch, tmp_path):
    made = []
    monkeypatch.setattr(relations, "make_shapes", lambda root, counts, *, seed, train_object_weights:
                        made.append((root, train_object_weights)))
    assert relations.TRAIN_OBJECT_WEIGHTS[MIX_SEED0] == (1, 2, 3)
    assert relations._data(MIX_SEED0, tmp_path / "shapes") == tmp_path / "shapes_objects123"
    assert relations._data("soft", tmp_path / "shapes") == tmp_path / "shapes"
    assert made == [(tmp_path / "shapes_objects123", (1, 2, 3)), (tmp_path / "shapes", None)]
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "dataset_shapes.json").write_text("{}")
    relations._data("soft", tmp_path / "shapes")
    assert len(made) == 2  # made once, kept after


def test_the_table_keeps_the_row_of_a_run_that_ended_in_another_process(relations, monkeypatch, tmp_path):
    """Two `--only` runs side by side: the one that writes the table last must not drop the other's row,
    though that row was written after it had passed the row's name (here seed 0's, written while seed 1
    trains)."""
    kept, doc = tmp_path / "results", tmp_path / "attention.md"
    kept.mkdir()
    example = json.loads((REPO / "docs" / "relations_study" / "soft.json").read_text())

    def run(name, *, data, out, results):
        shutil.copy(REPO / "docs" / "relations_study" / "soft.json", results / f"{MIX_SEED0}.json")  # the other process
        (results / f"{name}.json").write_text(json.dumps(example))
        return example

    monkeypatch.setattr(relations, "run", run)
    monkeypatch.setattr(sys, "argv", ["relations.py", "--only", "objects123_seed1", "--results", str(kept),
                                      "--doc", str(doc), "--data", str(tmp_path / "shapes")])
    assert relations.main() == 0
    rows = [line.split(" | ")[0] for line in doc.read_text().splitlines() if line.startswith("| soft_")]
    assert rows == [f"| {MIX_SEED0}", f"| {MIX_SEED1}"]
