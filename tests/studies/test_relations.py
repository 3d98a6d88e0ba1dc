"""The relations study's bookkeeping (studies/relations/run.py): which data a run trains on, the table
after runs side by side, and its two configurations against the runs they come from."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from captioning.config import Config, load_config
from tests.tiny import REPO

MIX_SEED0 = "soft_local_layout_glimpses_coordinates_16ep_by_probe_words3_patience3_objects123_seed0"
MIX_SEED1 = MIX_SEED0.replace("_seed0", "_seed1")


pytestmark = pytest.mark.study
RESULTS = REPO / "studies" / "relations" / "results"
CONFIGS = REPO / "studies" / "relations" / "configs"


@pytest.fixture
def relations():
    from studies.relations import run

    return run


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
    example = json.loads((RESULTS / "soft.json").read_text())

    def run(name, *, data, out, results):
        shutil.copy(RESULTS / "soft.json", results / f"{MIX_SEED0}.json")  # the other process
        (results / f"{name}.json").write_text(json.dumps(example))
        return example

    monkeypatch.setattr(relations, "run", run)
    monkeypatch.setattr(sys, "argv", ["relations.py", "--only", "objects123_seed1", "--results", str(kept),
                                      "--doc", str(doc), "--data", str(tmp_path / "shapes")])
    assert relations.main() == 0
    rows = [line.split(" | ")[0] for line in doc.read_text().splitlines() if line.startswith("| soft_")]
    assert rows == [f"| {MIX_SEED0}", f"| {MIX_SEED1}"]


def test_a_two_glimpse_result_scored_on_the_first_glimpse_is_scored_again_on_the_mean(relations, monkeypatch,
                                                                                       tmp_path):
    """Kept results from when a two-glimpse decoder reported its first glimpse's maps: re-scored on the
    mean of both where the checkpoint is kept (the same captions, or it stops), marked where it is not."""
    from captioning.config import load_config

    config_name, overrides = relations.RUNS[MIX_SEED0]
    config = load_config(REPO / "configs" / config_name, list(overrides))
    assert config.model.extras.glimpses == 2
    now = json.loads((RESULTS / f"{MIX_SEED0}.json").read_text())
    assert now["reported_map"] == "mean of glimpses"
    before = json.loads(json.dumps(now))
    del before["reported_map"]
    for label in relations.DECODINGS:
        before[label]["attention_correctness"] = before[label].pop("attention_correctness_first_glimpse")
    rescored = {label: {**now[label], "seconds": 1.0} for label in relations.DECODINGS}
    monkeypatch.setattr(relations, "_decodings", lambda decoder, test, vocab, *, probe: rescored)
    for name in ("load_checkpoint", "decoder_from_checkpoint", "Vocabulary"):
        monkeypatch.setattr(relations, name, lambda *args, **kwargs: {"vocab": []})
    monkeypatch.setattr(relations, "load_splits", lambda config, names: {"test": None})

    gone = json.loads(json.dumps(before))
    relations._complete_kept(MIX_SEED0, gone, config=config, run_dir=tmp_path / "gone")
    assert gone["reported_map"] == "first glimpse" and gone["greedy"] == before["greedy"]
    assert relations._row(MIX_SEED0, gone).count("x** (first glimpse)") == len(relations.DECODINGS)

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "best.pt").write_bytes(b"")
    relations._complete_kept(MIX_SEED0, before, config=config, run_dir=tmp_path / "kept")
    assert before == now
    row = relations._row(MIX_SEED0, before)
    assert "(first glimpse)" not in row and row.count("x** (first glimpse ") == len(relations.DECODINGS)

    del before["reported_map"]
    rescored["greedy"]["CIDEr"] += 0.01  # decoding again would not give the captions that were scored
    with pytest.raises(SystemExit, match="CIDEr"):
        relations._complete_kept(MIX_SEED0, before, config=config, run_dir=tmp_path / "kept")


# the study's configurations -------------------------------------------------------------------------


def flat(config: Config) -> dict[str, object]:
    """Every setting of a config by its dotted key: {"model.extras.init": "mean", ...}."""
    def walk(values: dict, prefix: str) -> dict[str, object]:
        found = {}
        for key, value in values.items():
            dotted = f"{prefix}.{key}" if prefix else key
            found.update(walk(value, dotted) if isinstance(value, dict) and key != "word_weights" else {dotted: value})
        return found
    return walk(config.to_dict(), "")


def test_the_relations_config_is_the_soft_one_with_what_it_says_changed():
    soft = flat(load_config(REPO / "configs" / "shapes_soft.yaml"))
    relations = flat(load_config(CONFIGS / "shapes_relations.yaml"))
    changed = {key: relations[key] for key in soft if soft[key] != relations[key]}
    assert changed == {"model.score": "local", "model.extras.init": "layout", "train.out_dir": "runs/shapes_relations"}


def test_the_16_epoch_relations_config_is_the_run_the_study_reports(relations):
    """configs/shapes_relations_16ep.yaml is the study's run
    soft_local_layout_glimpses_coordinates_16ep_by_probe_words3_patience3_query_word_narrow_dropout01_ema0999
    (seeds 0 to 5), decoded with beam 5: the numbers the README gives for it are that run's."""
    run_name = ("soft_local_layout_glimpses_coordinates_16ep_by_probe_words3_patience3_query_word_narrow_dropout01"
                "_ema0999_seed0")
    config_name, overrides = relations.RUNS[run_name]
    run = flat(load_config(REPO / "configs" / config_name, list(overrides)))
    long = flat(load_config(CONFIGS / "shapes_relations_16ep.yaml"))
    changed = {key: long[key] for key in run if run[key] != long[key]}
    assert changed == {"train.out_dir": "runs/shapes_relations_16ep", "decode.beam_size": 5}
    assert (long["train.lr_patience"], long["train.seed"]) == (3, 0)
    assert long["train.word_weights"] == {word: 3 for word in ("to", "left", "right", "above", "below")}
    assert long["model.extras.query_word"] is True
    assert (long["model.local.sigma"], long["model.dropout"]) == (1.75, 0.1)
    assert long["train.ema_decay"] == 0.999
