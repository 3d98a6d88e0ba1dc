"""Kill anywhere, lose nothing: SIGKILL at random moments of `prepare-features` and of training
(inside a step, a checkpoint write, a validation: wherever the clock falls), resume after each, and
compare with an uninterrupted run. The cache must end byte-identical, every checkpoint on disk must
load at every moment, and the final weights must equal the uninterrupted run's exactly (CPU, one
thread, same seed).

CI runs a few kills (KILLS_CACHE=2, KILLS_TRAIN=3); `make kill-check` runs the full version
(10 and 20), whose figures docs/reliability.md reports.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.checkpoint import load_checkpoint
from tests.tiny import REPO

KILLS_CACHE = int(os.environ.get("KILLS_CACHE", "2"))
KILLS_TRAIN = int(os.environ.get("KILLS_TRAIN", "3"))
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CAPTIONING_QUIET": "1"}


def _killed_until_done(command: Callable[[], list[str]], *, kills: int, seed: int, window: tuple[float, float],
                       check: Callable[[], None]) -> int:
    """Run `command()`, SIGKILL it after a random time in `window` seconds, `kills` times, calling
    `check()` after each kill; then let it finish. Returns how many kills landed (the process was
    still running when its time came)."""
    rng = random.Random(seed)
    landed = 0
    for _ in range(kills):
        process = subprocess.Popen(command(), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(*window))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            landed += 1
        _, err = process.communicate()
        assert process.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
        check()
    finished = subprocess.run(command(), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-2000:]
    check()
    return landed


@pytest.mark.slow
def test_prepare_features_killed_anywhere_ends_byte_identical(tmp_path: Path) -> None:
    from captioning.data.shapes.scenes import make_shapes

    data = tmp_path / "shapes"
    make_shapes(data, {"train": 150 * KILLS_CACHE, "val": 4, "test": 4}, seed=3, image_size=96)  # ~1 s per kill
    command = [sys.executable, "-m", "captioning.cli", "prepare-features", f"data.root={data}",
               "data.image_size=96", "encoder.batch_size=8", "--splits", "train", "--quiet"]
    subprocess.run(command, cwd=REPO, env=ENV, check=True, capture_output=True)
    (cache,) = (data / "features").iterdir()
    reference = {p.name: p.read_bytes() for p in cache.iterdir()}
    for path in cache.iterdir():
        path.unlink()
    landed = _killed_until_done(lambda: command, kills=KILLS_CACHE, seed=1, window=(2.2, 3.5), check=lambda: None)
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == reference  # .npy and .json, byte for byte
    print(f"prepare-features: {landed} of {KILLS_CACHE} kills landed; cache byte-identical")


@pytest.fixture(scope="module")
def uninterrupted(tiny_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole")
    subprocess.run([sys.executable, "train.py", *tiny_run.overrides, *_RUN, f"train.out_dir={out}", "--quiet"],
                   cwd=REPO, env=ENV, check=True, capture_output=True, timeout=600)
    return out


STEPS = 60 * KILLS_TRAIN  # enough work that every kill lands while it trains (about 20 steps a second)
_RUN = (f"train.max_steps={STEPS}", "train.save_every_steps=1", "train.eval_every_steps=10", "train.val_images=8",
        "train.early_stop_patience=1000", "train.epochs=1000", "train.seed=4")


@pytest.mark.slow
def test_training_killed_anywhere_resumes_to_the_same_weights(tiny_run, uninterrupted: Path, tmp_path: Path) -> None:
    checks = []

    def every_checkpoint_loads() -> None:
        for name in ("last.pt", "best.pt"):
            if (tmp_path / name).exists():
                load_checkpoint(tmp_path / name)  # raises if truncated or half-written
                checks.append(name)

    def command() -> list[str]:  # --resume once there is something to resume from
        resume = ["--resume"] if (tmp_path / "last.pt").exists() else []
        return [sys.executable, "train.py", *tiny_run.overrides, *_RUN, f"train.out_dir={tmp_path}", "--quiet", *resume]

    landed = _killed_until_done(command, kills=KILLS_TRAIN, seed=2, window=(2.5, 5.5), check=every_checkpoint_loads)
    ours = load_checkpoint(tmp_path / "last.pt")
    theirs = load_checkpoint(uninterrupted / "last.pt")
    assert ours["progress"]["step"] == theirs["progress"]["step"] == STEPS
    for name, tensor in theirs["decoder"].items():
        assert torch.equal(ours["decoder"][name], tensor), name
    for name, tensor in theirs["optimizer"]["state"].items():
        assert all(torch.equal(a, b) for a, b in zip(ours["optimizer"]["state"][name].values(), tensor.values()))
    print(f"training: {landed} of {KILLS_TRAIN} kills landed, {len(checks)} checkpoint loads after kills; "
          "final weights equal")
    assert np.isfinite(ours["progress"]["best_metric"])


def test_a_run_resumed_at_its_step_limit_trains_no_further(tiny_config, tmp_path: Path) -> None:
    """Killed between its last step and its exit, a run resumes at max_steps: it validates, saves and
    stops, instead of training one step past the limit (which the kills above found)."""
    from captioning.train.loop import fit

    config = tiny_config(tmp_path, "train.max_steps=3")
    assert fit(config)["steps"] == 3
    assert fit(config, resume=True)["steps"] == 3
    assert load_checkpoint(tmp_path / "last.pt")["progress"]["step"] == 3


def test_a_log_line_torn_by_a_kill_does_not_stop_the_resume(tmp_path: Path) -> None:
    from captioning.train.run_folder import RunLog

    (tmp_path / "log.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\n{"step": 3, "lo')
    log = RunLog(tmp_path, resumed_at=2)
    log.close()
    assert (tmp_path / "log.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\n'


def test_the_vocabulary_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch) -> None:
    from captioning.data.vocab import SPECIALS, Vocabulary

    path = tmp_path / "vocab.json"
    Vocabulary([*SPECIALS, "a", "dog"]).save(path)

    import captioning.runtime.files as replacing

    def dies(source, target):  # the whole text is on the disk under its temporary name; the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(replacing.os, "replace", dies)
    with pytest.raises(KeyboardInterrupt):
        Vocabulary([*SPECIALS, "a", "cat", "sat"]).save(path)
    monkeypatch.undo()
    assert Vocabulary.load(path).words == [*SPECIALS, "a", "dog"]
