"""Checkpoints written before the config had sections and the decoder had seams (format 1) load,
caption, score and resume exactly as the code that wrote them did (tests/fixtures/format1/README.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from captioning.checkpoint import FORMAT_VERSION, decoder_from_checkpoint, load_checkpoint, migrate_v1
from captioning.config import ConfigError, from_dict, load_config
from captioning.model.decoding import decode
from captioning.train.loop import fit
from captioning.train.paper_objective import PaperObjective
from tests.tiny import REPO, TINY

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "format1"
EXPECTED = torch.load(FIXTURES / "expected.pt", weights_only=True)
# each fixture: the config it was trained with, in today's keys
RUNS = {"soft": ("configs/shapes_soft.yaml", ()),
        "hard": ("configs/shapes_hard.yaml", ("model.hard.warmup=4", "train.reinforce.weight_warmup=8")),
        "relations": ("studies/relations/configs/shapes_relations_16ep.yaml", ())}


@pytest.mark.parametrize("name", RUNS)
def test_a_format1_checkpoint_computes_what_the_old_code_computed(name):
    payload = load_checkpoint(FIXTURES / f"{name}_last.pt")
    assert payload["format_version"] == FORMAT_VERSION == 2
    config = from_dict(payload["config"])
    decoder = decoder_from_checkpoint(payload, config)  # a strict load: every parameter has its new name
    expected, annotations = EXPECTED[name], EXPECTED["annotations"]
    vocab_size = len(payload["vocab"])
    tokens = torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 0, 0]]) % vocab_size
    tokens[:, 0] = 1
    with torch.no_grad():
        output = decoder(annotations, tokens[:, :-1], lengths=torch.tensor([5, 3]))
    torch.testing.assert_close(output.logits, expected["logits"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(output.alphas, expected["alphas"], rtol=1e-5, atol=1e-6)
    for choice in (("expectation", "argmax") if name == "hard" else (None,)):
        for beam in (1, 2):
            captions = decode(decoder, annotations, beam_size=beam, max_length=8, hard_choice=choice)
            assert torch.equal(captions.tokens, expected[f"tokens_{choice}_{beam}"]), (choice, beam)
            torch.testing.assert_close(captions.alphas, expected[f"alphas_{choice}_{beam}"], rtol=1e-5, atol=1e-6)


def test_the_migrated_config_names_every_setting_in_its_section():
    relations = from_dict(load_checkpoint(FIXTURES / "relations_last.pt")["config"])
    assert (relations.model.extras.glimpses, relations.model.extras.query_word) == (2, True)
    assert (relations.model.extras.init, relations.model.extras.position) == ("layout", "coordinates")
    assert relations.model.local.sigma == 1.75 and relations.train.ema_decay == 0.999
    hard = from_dict(load_checkpoint(FIXTURES / "hard_last.pt")["config"])
    assert (hard.model.hard.warmup, hard.train.reinforce.weight_warmup) == (4, 8)
    assert hard.decode.hard_choice == "expectation"


def test_a_format1_config_file_is_refused_naming_each_key_that_moved(tmp_path):
    """Its base is read first, and names train.ds_weight, whose meaning changed since (REDEFINED); with
    that one renamed, the file's own flat keys are named with their sections."""
    with pytest.raises(ConfigError, match=r"shapes_soft.yaml: 'train.ds_weight' is now 'train.ds_lambda': the "
                                          r"doubly stochastic term is now weighed"):
        load_config(FIXTURES / "shapes_hard_v1.yaml")
    shutil.copy(FIXTURES / "shapes_hard_v1.yaml", tmp_path)
    base = (FIXTURES / "shapes_soft.yaml").read_text()
    (tmp_path / "shapes_soft.yaml").write_text(base.replace("ds_weight:", "ds_lambda:"))
    with pytest.raises(ConfigError, match=r"shapes_hard_v1.yaml: 'model.hard_expectation_prob' is now "
                                          r"'model.hard.expectation_prob'"):
        load_config(tmp_path / "shapes_hard_v1.yaml")


@pytest.mark.parametrize("name", RUNS)
def test_training_resumes_from_a_format1_checkpoint_as_the_old_code_did(name, tmp_path, shapes_root, monkeypatch):
    """The two steps after resuming from the format-1 last.pt (step 4) give the old code's losses:
    weights, optimizer, RNG states, the weights' average, the REINFORCE baseline and both warm-ups
    (hard attention's coin and the REINFORCE terms) carry over.

    The old code's hard attention sampled from torch's RNG; a run today gives every row its own
    uniforms (PaperObjective.uniforms, attention.Draws), so that its samples do not depend on how processes
    split a batch. Without draws the decoder still samples as the old code did: that path is what the
    fixture's losses can check."""
    monkeypatch.setattr(PaperObjective, "uniforms", lambda self, *, step, size, rows, positions=None: None)
    config_file, extra = RUNS[name]
    out = tmp_path / name
    out.mkdir()
    shutil.copy(FIXTURES / f"{name}_last.pt", out / "last.pt")
    config = load_config(REPO / config_file, [f"data.root={shapes_root}", *TINY, f"train.out_dir={out}",
                                              "train.log_every_steps=1", "train.max_steps=6", *extra])
    fit(config, resume=True)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [entry["loss"] for entry in log if "loss" in entry and entry["step"] > 4]
    torch.testing.assert_close(torch.tensor(losses, dtype=torch.float64), EXPECTED[name]["resumed_losses"],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("model", "index"), [({"unit_annotations": True}, 1), ({"unit_annotations": False}, 0),
                                              ({}, 0), (None, 0)])
def test_a_format1_learned_position_becomes_attentions_first_input_or_second_after_unit_annotations(model, index):
    """Format 1 kept the learned position under attention.position; format 2 lists attention's inputs,
    the unit-norm rescaling first where it is on (extras/unit_annotations.py), so the position is input 1 there."""
    weight = torch.randn(4, 3)
    elsewhere = torch.zeros(2)  # a ".position." outside attention is not attention's input
    payload = {"format_version": 1, "config": {} if model is None else {"model": dict(model)}, "vocab": [],
               "grid": [2, 2], "decoder": {"attention.position.weight": weight, "attention.score.w": torch.zeros(1),
                                           "init.position.bias": elsewhere}}
    migrated = migrate_v1(payload)
    assert set(migrated["decoder"]) == {f"attention.inputs.{index}.weight", "attention.score.w", "init.position.bias"}
    assert migrated["decoder"][f"attention.inputs.{index}.weight"] is weight
    assert migrated["config"].get("model", {}).get("extras", {}).get("unit_annotations", False) == bool(index)


def test_inspect_says_a_format1_checkpoint_is_format_1(capsys):
    from captioning.cli import main

    assert main(["inspect", str(FIXTURES / "soft_last.pt")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"{FIXTURES / 'soft_last.pt'}: captioning checkpoint, format 1 (read as format 2: its settings "
                     "and weights under today's names)")
