"""A recipe that configs/ documents is the one the Flickr8k study measured: the config file and the
study's run (its config and overrides) give the same settings, but where the study puts its files."""

from __future__ import annotations

import dataclasses

import pytest

from captioning.config import load_config
from studies.flickr8k.runs import RUNS
from tests.tiny import REPO

# config file -> the study runs it documents
DOCUMENTED = {"flickr8k_hard_from_soft.yaml": ("hard_from_soft", "hard_from_soft_seed1")}


def _settings(config) -> dict:
    values = dataclasses.asdict(config)
    for key in ("init_from", "out_dir", "seed"):  # the study's paths and each run's seed
        values["train"].pop(key)
    return values


@pytest.mark.parametrize("name, runs", DOCUMENTED.items())
def test_a_documented_recipe_is_the_studys_run(name, runs):
    documented = _settings(load_config(REPO / "configs" / name, []))
    for run in runs:
        spec = RUNS[run]
        assert _settings(load_config(REPO / "configs" / spec.config, list(spec.overrides))) == documented, run
