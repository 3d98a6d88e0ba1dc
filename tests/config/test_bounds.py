"""Sizes have bounds, checked when the config is loaded: an absurd one is one line naming the setting
before any data or model work; a model within the bounds that is still too large for the machine is
one line naming the model's settings where it is built, not a traceback."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import captioning.config.bounds as bounds
from captioning.cli import main, train_main
from captioning.config import ConfigError, load_config
from tests.tiny import REPO, TINY

# every size setting, its bound, and the choice that owns its section where it has one
SIZES = [
    ("data.image_size", bounds.IMAGE_SIDE, []), ("data.max_caption_length", bounds.LENGTH, []),
    ("encoder.batch_size", bounds.BATCH, []), ("model.embed_dim", bounds.WIDTH, []),
    ("model.hidden_dim", bounds.WIDTH, []), ("model.attention_dim", bounds.WIDTH, []),
    ("model.extras.grid_attention", bounds.HEADS, []), ("train.batch_size", bounds.BATCH, []),
    ("train.val_beam_size", bounds.BEAM, []), ("train.num_workers", bounds.WORKERS, []),
    ("train.reinforce.location_samples", bounds.SAMPLES, ["model.attention=hard"]),
    ("train.scst.samples", bounds.SAMPLES, ["train.objective=scst"]),
    ("decode.beam_size", bounds.BEAM, []), ("decode.max_length", bounds.LENGTH, []),
]


@pytest.mark.parametrize("key, bound, owner", SIZES, ids=[key for key, _, _ in SIZES])
def test_a_size_past_its_bound_is_refused_at_load_naming_it_and_the_bound_is_taken(key, bound, owner):
    setting = load_config(None, [*owner, f"{key}={bound}"])
    for part in key.split("."):
        setting = getattr(setting, part)
    assert setting == bound
    with pytest.raises(ConfigError) as refused:
        load_config(None, [*owner, f"{key}={bound + 1}"])
    assert str(refused.value) == (f"config: {key} must be at most {bound} (far beyond any real run: "
                                  f"captioning/config/bounds.py), got {bound + 1}")


def test_the_bounds_leave_every_shipped_config_alone():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path)


def test_an_absurd_size_on_the_command_line_is_one_line_before_anything_is_made(tmp_path, capsys, monkeypatch):
    import captioning.data.formats.shapes as shapes_format

    # were it not refused, the embedded default's data would be drawn: a few small scenes, quickly
    monkeypatch.setattr(shapes_format, "SHAPES_DEFAULT_COUNTS", {"train": 2, "val": 1, "test": 1})
    data, run = tmp_path / "data", tmp_path / "run"
    code = train_main(["--device", "cpu", f"data.root={data}", "data.image_size=32", f"train.out_dir={run}",
                       "model.hidden_dim=99999999999999999999"])
    lines = capsys.readouterr().err.splitlines()
    assert (code, lines) == (2, ["error: config: model.hidden_dim must be at most 65536 (far beyond any real run: "
                                 "captioning/config/bounds.py), got 99999999999999999999"])
    assert not data.exists() and not run.exists()
    assert main(["prepare", f"data.root={data}", "decode.beam_size=10000000", f"train.out_dir={run}"]) == 2
    assert capsys.readouterr().err.startswith("error: config: decode.beam_size must be at most 1024 ")


def test_a_model_within_the_bounds_too_large_for_the_machine_is_one_line_naming_its_settings(shapes_root,
                                                                                          tmp_path: Path):
    """model.hidden_dim at its bound: the LSTM's recurrent weights alone are 64 GiB. Run under a
    16 GiB address-space limit, so that the allocation fails alike on every machine, however large."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))

    run = tmp_path / "run"
    sizes = [text for text in TINY if not text.startswith("model.hidden_dim=")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "train.py", "--device", "cpu", "--quiet", f"data.root={shapes_root}", *sizes,
                           f"model.hidden_dim={bounds.WIDTH}", f"train.out_dir={run}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = done.stderr.splitlines()
    assert re.fullmatch(rf"error: model.embed_dim=16, model.hidden_dim={bounds.WIDTH}, model.attention_dim=16: the "
                        r"decoder is too large to build on cpu \(not enough memory for its weights, with \d+ words and "
                        r"112-wide annotations\); make them smaller", line), line
    assert not list(run.glob("*.pt"))
