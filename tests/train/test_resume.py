"""Exact resume after SIGKILL (a subprocess killed in the middle of a checkpoint save) and after
SIGTERM (save, then a clean exit), and the epoch's batches: bucketed, complete, a function of
(seed, epoch). CPU, deterministic: the resumed run logs the very losses of an uninterrupted one.
A resume goes on with the model its checkpoint holds: other settings of it are one line, and the run
folder is left as it was."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import captioning.train.paper_objective as cross_entropy
from captioning.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from captioning.cli import train_main
from captioning.data.dataset import epoch_batches, rank_batches
from captioning.runtime.hardware import Hardware
from captioning.train.loop import Run, fit
from captioning.train.resume import LastCheckpoint
from tests.tiny import REPO

RUN = ("train.max_steps=12", "train.save_every_steps=2", "train.log_every_steps=1")  # 8 batches per epoch


def _losses(out: Path) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [(e["step"], e["loss"]) for e in lines if "loss" in e]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "last.pt", map_location="cpu", weights_only=True)["decoder"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, tiny_config) -> Path:
    out = tmp_path_factory.mktemp("straight")
    fit(tiny_config(out, *RUN))
    assert [step for step, _ in _losses(out)] == list(range(1, 13))
    return out


def _assert_same_run(a: Path, b: Path) -> None:
    assert _losses(a) == _losses(b)  # every step's loss, exactly
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[name], wb[name]) for name in wa)


KILLER = textwrap.dedent("""
    import os, signal, sys
    import torch
    import captioning.train.loop as training
    from captioning.cli import train_main

    saves = 0
    real = training.save_checkpoint

    def save_then_die(path, payload):
        global saves
        saves += 1
        if saves == int(os.environ["KILL_AT_SAVE"]):
            # Die in the middle of the save: the temporary file is written, the rename never happens.
            torch.save(payload, path.with_name(f".{path.name}.tmp"))
            os.kill(os.getpid(), signal.SIGKILL)
        real(path, payload)

    training.save_checkpoint = save_then_die
    sys.exit(train_main(sys.argv[1:]))
""")


def test_sigkill_mid_epoch_then_resume_gives_the_same_losses(tmp_path: Path, tiny_run, uninterrupted: Path) -> None:
    out = tmp_path / "killed"
    args = [*tiny_run.overrides, f"train.out_dir={out}", *RUN]
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "KILL_AT_SAVE": "3", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), "--device", "cpu", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    saved = torch.load(out / "last.pt", map_location="cpu", weights_only=True)["progress"]
    assert (saved["step"], saved["epoch"], saved["batch_in_epoch"]) == (4, 0, 4)  # the save at step 6 died
    assert (out / ".last.pt.tmp").exists()  # the half-done save, never renamed
    assert max(step for step, _ in _losses(out)) == 6  # it had trained past its last checkpoint

    assert train_main(["--resume", "--device", "cpu", *args]) == 0
    assert [step for step, _ in _losses(out)] == list(range(1, 13))  # steps 5, 6 logged once, not twice
    _assert_same_run(uninterrupted, out)


def test_sigterm_saves_exits_cleanly_and_resumes_exactly(tmp_path: Path, tiny_run, uninterrupted: Path,
                                                         monkeypatch, capsys) -> None:
    out = tmp_path / "terminated"
    args = ["--device", "cpu", *tiny_run.overrides, f"train.out_dir={out}", *RUN]
    real, calls = cross_entropy.paper_loss, []

    def terminated_at_step_5(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # what a cluster sends before preempting the job
        return real(*a, **k)

    monkeypatch.setattr(cross_entropy, "paper_loss", terminated_at_step_5)
    assert train_main(args) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM after 5 steps" in capsys.readouterr().err
    assert torch.load(out / "last.pt", map_location="cpu", weights_only=True)["progress"]["step"] == 5
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone again
    monkeypatch.setattr(cross_entropy, "paper_loss", real)
    assert train_main(["--resume", *args]) == 0
    _assert_same_run(uninterrupted, out)


# the epoch's batches -------------------------------------------------------------------------------


def test_bucketed_batches_are_complete_deterministic_and_less_padded() -> None:
    lengths = [int(x) for x in torch.randint(5, 25, (1000,), generator=torch.Generator().manual_seed(0))]
    batches = epoch_batches(lengths, batch_size=16, seed=3, epoch=2, pool=10)
    assert sorted(i for b in batches for i in b) == list(range(1000))  # every pair once
    assert batches == epoch_batches(lengths, batch_size=16, seed=3, epoch=2, pool=10)  # a pure function
    assert batches != epoch_batches(lengths, batch_size=16, seed=3, epoch=3, pool=10)
    plain = epoch_batches(lengths, batch_size=16, seed=3, epoch=2, bucket=False)

    def padding(bs):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in bs)

    assert padding(batches) < 0.25 * padding(plain)
    spans = [max(lengths[i] for i in b) for b in batches]
    assert spans != sorted(spans) and spans != sorted(spans, reverse=True)  # the batch order is shuffled


def test_rank_batches_split_each_global_batch() -> None:
    batches = [list(range(0, 16)), list(range(16, 31)), [31]]
    parts = [rank_batches(batches, rank=r, world_size=2) for r in (0, 1)]
    assert parts[0] == [list(range(0, 8)), list(range(16, 23)), []]  # one slice per global batch, always
    assert parts[1] == [list(range(8, 16)), list(range(23, 31)), [31]]  # [31] alone: rank 0 gets nothing
    assert rank_batches(batches, rank=0, world_size=1) == batches


def test_a_run_tokenizes_each_training_caption_once_and_its_resume_none(tiny_config, shapes_root, tmp_path,
                                                                          monkeypatch):
    """On COCO, tokenizing the 566 747 training captions takes most of a minute: a run used to do it
    twice as it started (the vocabulary, then the pairs) and again at every resume (docs/scale.md)."""
    import captioning.data.tokenized as tokenized_module
    from captioning.data.records import read_records

    calls = []
    real = tokenized_module.tokenize
    monkeypatch.setattr(tokenized_module, "tokenize",
                        lambda caption, *, language: calls.append(caption) or real(caption, language=language))
    root = tmp_path / "data"  # the session's data, less the tokens other tests' runs kept there
    root.mkdir()
    for entry in shapes_root.iterdir():
        if entry.name != "tokens":
            (root / entry.name).symlink_to(entry)
    out = tmp_path / "run"
    config = tiny_config(out, "train.max_steps=1", f"data.root={root}")
    fit(config)
    assert len(calls) == sum(len(record.captions) for record in read_records(config.data, "train")) > 0
    calls.clear()
    fit(tiny_config(out, "train.max_steps=2", f"data.root={root}"), resume=True)
    assert calls == []


# resuming another model ----------------------------------------------------------------------------


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder`, hidden ones too (.run.pid), with its bytes and when it was last written."""
    return {str(path.relative_to(folder)): (path.read_bytes(), path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_resume_with_other_model_settings_is_one_line_and_leaves_the_run_as_it_was(tiny_run, tmp_path: Path) -> None:
    """A resumed run goes on training the model its checkpoint holds: other model settings (another
    shape, or the same shapes trained otherwise) are refused before anything is written, each named
    with the checkpoint's value and this run's."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, out)
    kept = _files(out)
    assert {"best.pt", "last.pt", "log.jsonl"} <= kept.keys()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "train.py", "--device", "cpu", "--resume", *tiny_run.overrides,
                           f"train.out_dir={out}", "model.hidden_dim=48", "model.dropout=0.5"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: {out / 'last.pt'}: --resume goes on with the model this run trained, and this run's model "
        "settings differ from it (model.hidden_dim: 32 -> 48; model.dropout: 0.3 -> 0.5); resume with the "
        "checkpoint's, or train another model in another train.out_dir (train.init_from starts from these "
        "weights where their shapes fit)"]
    assert _files(out) == kept  # best.pt, last.pt, the logs, .run.pid: not one byte, not one write


def test_resume_takes_other_settings_of_how_it_trains_and_how_it_computes(tiny_run, tiny_config,
                                                                          tmp_path: Path) -> None:
    """What --resume allowed before stays allowed: the training's own settings (train.*), and
    model.fused, which computes the same equations another way (the way out a fast path that
    disagrees with the step-by-step decoder names)."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, out)
    config = tiny_config(out, f"train.max_steps={tiny_run.steps + 1}", "train.lr=0.005", "model.fused=false")
    assert fit(config, resume=True)["steps"] == tiny_run.steps + 1


def test_a_resume_trains_at_the_rates_and_schedule_its_config_gives(tiny_run, tiny_config, tmp_path: Path,
                                                                    capsys) -> None:
    """The optimizer's and the schedule's saved state used to bring back the rate, the decay and the
    patience they were saved with, whatever train.lr, lr_decay and lr_patience this run gave."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, out)
    lr = load_checkpoint(out / "last.pt")["optimizer"]["param_groups"][0]["lr"]
    config = tiny_config(out, f"train.max_steps={tiny_run.steps + 8}", "train.lr=0.002", "train.lr_decay=0.1",
                         "train.lr_patience=0")
    run = Run.start(config, resume=True, hardware=Hardware.setup("cpu", amp=False))
    try:
        assert [group["lr"] for group in run.optimizer.param_groups] == [0.002]
        assert (run.scheduler.factor, run.scheduler.patience) == (0.1, 0)
    finally:
        run.close()
    assert capsys.readouterr().err.splitlines() == [f"resume: train.lr: 0.01 -> 0.002: the rate from here on, in "
                                                    f"place of {lr:g}"]
    # Unchanged, the saved rate goes on, decayed as it was.
    unchanged = Run.start(tiny_config(out), resume=True, hardware=Hardware.setup("cpu", amp=False))
    try:
        assert [group["lr"] for group in unchanged.optimizer.param_groups] == [lr]
    finally:
        unchanged.close()
    assert capsys.readouterr().err == ""


def test_a_resume_with_another_optimizer_or_other_batches_mid_epoch_is_one_line(tiny_run, tiny_config,
                                                                                tmp_path: Path) -> None:
    """Another optimizer cannot take the saved one's moments (RMSprop raised a KeyError from torch), and
    an epoch's batches made otherwise part way through it skip some pairs and repeat others. At an
    epoch's end (tiny_run's last.pt) the batches may change."""
    last = tiny_run.run_dir / "last.pt"
    with pytest.raises(CheckpointError) as error:
        LastCheckpoint.read(tiny_config(tiny_run.run_dir, "train.optimizer=rmsprop"))
    assert str(error.value) == (
        f"{last}: --resume goes on with the optimizer state this run saved, and this run's optimizer differs "
        "(train.optimizer: 'adam' -> 'rmsprop'); resume with the checkpoint's, or start another run from these "
        "weights with train.init_from")
    at_the_end = LastCheckpoint.read(tiny_config(tiny_run.run_dir, "train.batch_size=32", "train.seed=3"))
    assert at_the_end.payload["progress"]["batch_in_epoch"] == 0
    out = tmp_path / "run"
    out.mkdir()
    payload = load_checkpoint(last)
    save_checkpoint(out / "last.pt", {**payload, "progress": {**payload["progress"], "step": 85, "batch_in_epoch": 5}})
    assert LastCheckpoint.read(tiny_config(out, "train.lr=0.5")).payload["progress"]["step"] == 85
    with pytest.raises(CheckpointError) as error:
        LastCheckpoint.read(tiny_config(out, "train.batch_size=32", "data.mirror=true"))
    assert str(error.value) == (
        f"{out / 'last.pt'}: stopped in the middle of epoch 11, whose batches this run would make otherwise "
        "(data.mirror: False -> True; train.batch_size: 16 -> 32), skipping pairs or training some twice; finish "
        "the epoch with the checkpoint's settings and train.epochs=11, then resume with these")
    with pytest.raises(CheckpointError, match=r"\(data.max_caption_length: 20 -> 9\)"):  # the lengths it buckets by
        LastCheckpoint.read(tiny_config(out, "data.max_caption_length=9"))


def test_weights_that_do_not_fit_their_own_config_are_one_line(tiny_run, tmp_path: Path, capsys) -> None:
    """A last.pt edited by hand: its config is the run's, its weights are not of that model."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, out)
    payload = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    payload["decoder"]["embed.weight"] = payload["decoder"]["embed.weight"][:, :8].clone()
    torch.save(payload, out / "last.pt")
    words = len(payload["vocab"])
    assert train_main(["--device", "cpu", "--resume", *tiny_run.overrides, f"train.out_dir={out}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {out / 'last.pt'}: its weights or optimizer state do not fit the model and optimizer its config "
        f"describes (size mismatch for embed.weight: copying a param with shape torch.Size([{words}, 8]) from "
        f"checkpoint, the shape in current model is torch.Size([{words}, 16]).); it cannot be resumed"]


def test_a_resume_goes_on_from_the_last_save_even_one_made_after_it_first_read_last_pt(tiny_run, tiny_config,
                                                                                       tmp_path: Path) -> None:
    """fit reads last.pt before it takes the run's folder; a run that was ending then may save once
    more before it lets the folder go, and that save is the one to go on from."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, out)
    config = tiny_config(out)
    last = LastCheckpoint.read(config)
    assert last.latest(config) is last.payload
    save_checkpoint(out / "last.pt", {**last.payload, "progress": {**last.payload["progress"], "step": 81}})
    assert last.latest(config)["progress"]["step"] == 81


@pytest.mark.parametrize(("override", "refused"), [
    ("model.attention=hard", "model.attention: 'soft' -> 'hard'"),  # the same shapes, another model
    ("model.extras.temperature=2", "model.extras.temperature: 1.0 -> 2.0"),
    ("encoder.layer=stride32", "encoder.layer: 'stride16' -> 'stride32'"),  # the annotations it was trained on
    ("encoder.padding=reflect", "encoder.padding: 'zeros' -> 'reflect'"),
    ("data.image_size=128", "data.image_size: 96 -> 128"),
    ("model.fused=false", None),  # how it computes, not what
    ("encoder.batch_size=4", None),
    ("encoder.weights_path=elsewhere/efficientnet_lite0.pth", None),
    ("train.lr=0.5", None),
    ("decode.beam_size=5", None),
])
def test_what_a_resume_may_change(tiny_run, tiny_config, override: str, refused: str | None) -> None:
    config = tiny_config(tiny_run.run_dir, override)
    if refused is None:
        assert LastCheckpoint.read(config).payload["progress"]["step"] == tiny_run.steps
        return
    with pytest.raises(CheckpointError) as error:
        LastCheckpoint.read(config)
    assert f"settings differ from it ({refused}); " in str(error.value)
