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


def test_a_warm_start_from_a_file_cut_for_shipping_takes_its_weights_as_captioning_reads_them(
        tiny_run, tiny_config, tmp_path: Path) -> None:
    """The shipped models are int8 codes with their scales, and a fine-tuned encoder's file holds its
    tuned stages alone: a warm start from one said its weights did not fit (fine-tuning a shipped
    model on one's own photos). It takes what load_trained computes with."""
    from captioning.checkpoint import load_checkpoint, load_trained, save_checkpoint
    from captioning.shipped import for_captioning
    from tests.test_export import _fine_tuned_run

    tuned = _fine_tuned_run(tiny_run)
    last = tuned["config"]["encoder"]["fine_tune_from"]
    save_checkpoint(tmp_path / "int8.pt", for_captioning(tuned, precision="int8"))
    assert any(name.endswith(":scale") for name in load_checkpoint(tmp_path / "int8.pt")["decoder"])
    run = _start(tiny_config(tmp_path / "run", f"train.init_from={tmp_path / 'int8.pt'}",
                             f"encoder.fine_tune_from={last}"))
    captioned = load_trained(tmp_path / "int8.pt")
    for mine, theirs in ((run.model.decoder, captioned.decoder), (run.model.encoder, captioned.encoder())):
        state, expected = mine.state_dict(), theirs.state_dict()
        assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in state)
    frozen = [k for k in state if not k.startswith(f"body.{last}.")]
    assert frozen and all(torch.equal(state[k], tuned["encoder"][k]) for k in frozen)  # the pretrained weights


def test_a_warm_start_from_a_file_of_several_decoders_is_one_line(tiny_run, tiny_config, tmp_path: Path) -> None:
    """It took the first decoder and said nothing of the others."""
    from captioning.checkpoint import load_checkpoint, save_checkpoint
    from captioning.shipped import for_captioning

    payload = load_checkpoint(tiny_run.checkpoint)
    save_checkpoint(tmp_path / "both.pt", for_captioning(payload, members=[payload]))
    with pytest.raises(CheckpointError, match=f"^{tmp_path / 'both.pt'}: holds 2 decoders that caption together; "
                                              "a warm start takes one model's weights"):
        _start(tiny_config(tmp_path / "run", f"train.init_from={tmp_path / 'both.pt'}"))


def test_weights_that_do_not_fit_name_the_first_tensor_that_does_not(tiny_run, tiny_config, tmp_path: Path) -> None:
    """torch's first line ("Error(s) in loading state_dict for AttentionDecoder:") names none."""
    with pytest.raises(CheckpointError, match=r"\(size mismatch for [\w.]+: copying a param with shape"):
        _start(tiny_config(tmp_path, f"train.init_from={tiny_run.checkpoint}", "model.hidden_dim=48"))


@pytest.mark.parametrize("reads", ["data.feature_cache=true", "data.feature_cache=false"])
def test_a_fine_tuned_encoder_for_a_run_that_fine_tunes_none_is_one_line_before_any_data_work(
        tiny_run, tiny_config, tmp_path: Path, reads: str) -> None:
    """Refused only once the whole feature cache was built; and with the encoder run on the fly, its
    fine-tuned weights were loaded into a frozen encoder that no checkpoint keeps, so the decoder was
    captioned over the pretrained encoder, not the one it trained over."""
    from captioning.checkpoint import save_checkpoint
    from tests.test_export import _fine_tuned_run

    save_checkpoint(tmp_path / "tuned.pt", _fine_tuned_run(tiny_run))
    cache = tmp_path / "cache"
    with pytest.raises(CheckpointError, match=f"^{tmp_path / 'tuned.pt'}: its encoder was fine-tuned, but this run "
                                              "fine-tunes none"):
        _start(tiny_config(tmp_path / "run", f"train.init_from={tmp_path / 'tuned.pt'}", reads,
                           f"data.cache_root={cache}"))
    assert not cache.exists() or not any(path.suffix == ".npy" for path in cache.rglob("*"))
