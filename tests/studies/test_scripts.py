"""Every study's script imports and answers --help: nothing else runs them between studies, so a
renamed function in the package would otherwise go unnoticed until someone re-runs a study."""

from __future__ import annotations

import importlib
import sys

import pytest

pytestmark = pytest.mark.study

SCRIPTS = ("studies.attention_table.run", "studies.relations.run", "studies.relations.errors",
           "studies.relations.glimpses", "studies.relations.validation_time", "studies.hard_seeds.run",
           "studies.position_in_features.run", "studies.scst.run", "studies.flickr8k.run", "studies.flickr8k.ship",
           "studies.flickr8k.scst_maps", "studies.flickr8k.scst_rewards", "studies.flickr8k.validation_cost",
           "studies.flickr8k.mirror_decoding", "studies.flickr8k.selection")


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_study_script_imports_and_answers_help(name, monkeypatch, capsys):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_the_reinforce_variance_study_imports():
    """It has no command line; its toy decoder must still build (it prints its table in 30 s)."""
    study = importlib.import_module("studies.reinforce_variance.run")
    assert study.decoder().attention.expectation_prob == 0.0
