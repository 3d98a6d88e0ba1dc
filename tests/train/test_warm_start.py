"""A new run from a trained model (train.init_from): its weights and vocabulary, nothing else of its run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from captioning.checkpoint import CheckpointError
from captioning.config import load_config
from captioning.runtime.hardware import Hardware
from captioning.train.loop import Run, fit
from tests.tiny import REPO


def _start(config) -> Run:
    run = Run.start(config, resume=False, hardware=Hardware.setup("cpu", amp=False))
    run.close()
    return run


def test_a_warm_start_takes_the_weights_and_vocabulary_and_starts_afresh(tiny_run, tiny_config,
                                                                         tmp_path: Path) -> None:
    source = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    run = _start(tiny_config(tmp_path, f"train.init_from={tiny_run.checkpoint}", "train.seed=5"))
    state = run.model.decoder.state_dict()
    assert state.keys() == source["decoder"].keys()
    assert all(torch.equal(state[k], source["decoder"][k]) for k in state)
    assert run.data.vocab.words == source["vocab"]
    assert run.progress.step == 0 and run.progress.best_metric == float("-inf")
    assert run.optimizer.state_dict()["state"] == {}  # a fresh optimizer: no moments carried over
    fresh = _start(tiny_config(tmp_path / "fresh", "train.seed=5"))  # the same run without init_from
    assert not torch.equal(fresh.model.decoder.state_dict()["embed.weight"], state["embed.weight"])


def test_warm_start_trains_its_own_steps_and_resume_then_continues_that_run(tiny_run, tiny_config,
                                                                            tmp_path: Path) -> None:
    warm = tiny_config(tmp_path, f"train.init_from={tiny_run.checkpoint}", "train.max_steps=2")
    assert fit(warm)["steps"] == 2
    resumed = tiny_config(tmp_path, f"train.init_from={tiny_run.checkpoint}", "train.max_steps=3")
    assert fit(resumed, resume=True)["steps"] == 3  # --resume goes on from last.pt, not from init_from again
    payload = torch.load(tmp_path / "last.pt", map_location="cpu", weights_only=True)
    assert payload["progress"]["step"] == 3 and payload["config"]["train"]["init_from"] == str(tiny_run.checkpoint)


def test_a_different_prepared_vocabulary_is_a_one_line_error(tiny_run, tiny_config, tmp_path: Path) -> None:
    source = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    (tmp_path / "vocab.json").write_text(json.dumps([*source["vocab"], "zebra"]))
    with pytest.raises(CheckpointError) as error:
        _start(tiny_config(tmp_path, f"train.init_from={tiny_run.checkpoint}"))
    message = str(error.value)
    assert str(tiny_run.checkpoint) in message and "vocabulary" in message and "\n" not in message
    (tmp_path / "vocab.json").write_text(json.dumps(source["vocab"]))  # the same words: fine
    _start(tiny_config(tmp_path, f"train.init_from={tiny_run.checkpoint}"))


@pytest.mark.parametrize(("override", "named"), [("model.hidden_dim=48", "do not fit"),
                                                 ("model.score=dot", "do not fit")])
def test_a_model_of_another_shape_is_a_one_line_error(tiny_run, tiny_config, tmp_path: Path, override: str,
                                                      named: str) -> None:
    with pytest.raises(CheckpointError) as error:
        _start(tiny_config(tmp_path, f"train.init_from={tiny_run.checkpoint}", override))
    assert named in str(error.value) and str(tiny_run.checkpoint) in str(error.value)
    assert "\n" not in str(error.value)


def test_a_missing_checkpoint_is_a_one_line_error(tiny_config, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        _start(tiny_config(tmp_path, f"train.init_from={tmp_path / 'nowhere.pt'}"))


@pytest.mark.parametrize("name", ["coco_vgg19_finetune", "coco_resnet101_finetune"])
def test_the_second_stage_configs_start_from_the_first_stages_best(name: str) -> None:
    second = load_config(REPO / "configs" / f"{name}.yaml")
    first = load_config(REPO / "configs" / f"{name.replace('finetune', 'soft')}.yaml")
    assert second.train.init_from == f"{first.train.out_dir}/best.pt"
    assert second.encoder.fine_tune_from is not None and second.encoder.name == first.encoder.name
    assert (second.model, second.data.image_size, second.encoder.layer) == (first.model, first.data.image_size,
                                                                            first.encoder.layer)
    assert second.train.lr < first.train.lr and second.train.out_dir != first.train.out_dir
