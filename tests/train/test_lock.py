"""One run per folder, and a full disk: a clear line, and the previous checkpoint intact."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from captioning.train.loop import fit
from captioning.train.objective import TrainingError
from tests.tiny import REPO


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _wait_for(path: Path, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_a_second_run_into_a_live_runs_folder_refuses_and_resume_after_a_kill_takes_it_over(
        tiny_run, tiny_config, tmp_path: Path) -> None:
    first = subprocess.Popen([sys.executable, "train.py", *tiny_run.overrides, f"train.out_dir={tmp_path}",
                              "train.max_steps=100000", "train.save_every_steps=1", "--quiet"],
                             cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tmp_path / "last.pt", first)
        with pytest.raises(TrainingError) as error:
            fit(tiny_config(tmp_path, "train.max_steps=2"))
        assert str(tmp_path) in str(error.value) and str(first.pid) in str(error.value)
        assert "\n" not in str(error.value)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    summary = fit(tiny_config(tmp_path, "train.max_steps=100000", "train.epochs=1"), resume=True)  # the folder is free
    assert summary["steps"] > 0


def test_a_checkpoint_that_does_not_fit_on_disk_leaves_the_previous_one_intact(tiny_run, tmp_path: Path) -> None:
    target = tmp_path / "last.pt"
    target.write_bytes(tiny_run.last.read_bytes())
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing\n"
              "from captioning.checkpoint import CheckpointError, load_checkpoint, save_checkpoint\n"
              "payload = load_checkpoint(sys.argv[1])\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))\n"
              "try:\n    save_checkpoint(sys.argv[1], payload)\n"
              "except CheckpointError as error:\n    print(error)\n    sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", script, str(target)], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    message = done.stdout.strip()
    assert str(target) in message and "intact" in message and "\n" not in message
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary file left behind


def test_a_feature_cache_that_does_not_fit_on_disk_is_one_line(tiny_run, tmp_path: Path) -> None:
    """prepare-features under a 20 kB file-size limit: the cache of the 24 training images needs more."""
    import resource

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited through exec: writes fail instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    done = subprocess.run([sys.executable, "-m", "captioning.cli", "prepare-features", *tiny_run.overrides,
                           "data.image_size=64", "--splits", "train", "--quiet"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "feature cache could not be written" in errors[0] and "File too large" in errors[0]


@pytest.mark.parametrize("where", ["the folder", "the lock"])
def test_a_folder_the_run_may_not_write_is_one_line(tiny_config, tmp_path: Path, monkeypatch, where: str) -> None:
    """It was filelock's or mkdir's PermissionError, a traceback of 40 lines. (Root may write
    anywhere: the refusal is planted.)"""
    from filelock import FileLock

    out = tmp_path / "run"

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(out / ".run.lock"))

    monkeypatch.setattr(Path, "mkdir", refused) if where == "the folder" else monkeypatch.setattr(
        FileLock, "acquire", refused)
    with pytest.raises(TrainingError, match=f"^{out}: the run cannot write its folder \\(Permission denied\\); "
                                            "choose another train.out_dir$"):
        fit(tiny_config(out, "train.max_steps=2"))


def test_a_disk_that_fills_while_the_run_logs_stops_the_logs_in_one_line_not_the_run(tiny_run, tmp_path: Path) -> None:
    """A 300 kB file-size limit: TensorBoard's overlays of the first validation outgrow it. It was two
    tracebacks (one from TensorBoard's writer thread), 88 lines, before the validation's checkpoint was
    tried; now one line for the logs, and the checkpoint's own save says whether it fits."""
    import resource

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "train.py", "--device", "cpu", *tiny_run.overrides, f"train.out_dir={out}",
                           "train.max_steps=8"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
                          preexec_fn=limited)
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        f"note: {out}: the run's logs (log.jsonl, tensorboard/) are written no more (File too large); training goes on",
        f"error: {out / 'best.pt'}: could not be written (File too large); no best.pt was written"]
    assert done.stdout.startswith("step 8 epoch 1: ")  # the validation, measured and said
