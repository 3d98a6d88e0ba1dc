"""Two processes of one run (gloo on the CPU), each with a fault that only it sees: every process
must end, at the same step, with the same weights and the exit code that says why; none may wait
for the other until a timeout."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from captioning.train.loop import fit
from tests.train.ranks import launch

# Dropout off: two processes draw other masks than one, by design; everything else must match.
RUN = ("model.dropout=0", "train.max_steps=6", "train.batch_size=16", "train.log_every_steps=1",
       "train.dist_timeout=60")  # a regression that makes a process wait fails in a minute, not at the launcher's limit


def _ranks(out: Path) -> list[dict]:
    return [torch.load(out / f"rank{rank}.pt", map_location="cpu", weights_only=True) for rank in (0, 1)]


def _same_model(states: list[dict]) -> None:
    first, second = states
    assert first["step"] == second["step"] and first["skipped_steps"] == second["skipped_steps"]
    for name, value in first["decoder"].items():
        assert torch.equal(value, second["decoder"][name]), f"the processes hold different {name}"


def _close(a: dict, b: dict) -> None:
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-4, msg=name)


def test_sigterm_to_one_process_stops_both_at_the_same_step(tmp_path: Path, tiny_run) -> None:
    out = tmp_path / "run"
    done = launch(2, [*tiny_run.overrides, f"train.out_dir={out}", *RUN], cwd=tmp_path, fault="sigterm:1:3")
    assert [d.returncode for d in done] == [128 + signal.SIGTERM] * 2, [d.stderr[-2000:] for d in done]
    assert "stopped by SIGTERM after 3 steps" in done[0].stderr
    assert "stopped by" not in done[1].stderr  # rank 0 speaks for both
    states = _ranks(out)
    _same_model(states)
    assert states[0]["step"] == 3
    saved = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert saved["progress"]["step"] == 3


@pytest.mark.slow
def test_a_loss_that_is_not_finite_in_one_process_is_skipped_by_both(tmp_path: Path, tiny_run) -> None:
    """NaN at step 2 in one process, +inf at step 4 in the other."""
    out = tmp_path / "run"
    done = launch(2, [*tiny_run.overrides, f"train.out_dir={out}", *RUN], cwd=tmp_path, fault="nan:1:2,inf:0:4")
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    states = _ranks(out)
    _same_model(states)  # without the agreement one process steps, the other does not: the weights part
    assert states[0]["step"] == 6 and states[0]["skipped_steps"] == 2


@pytest.mark.slow
def test_a_process_with_no_readable_image_in_its_part_still_steps_with_the_other(tmp_path: Path, tiny_run) -> None:
    out = tmp_path / "run"
    done = launch(2, [*tiny_run.overrides, f"train.out_dir={out}", *RUN], cwd=tmp_path, fault="empty:1:2")
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    states = _ranks(out)
    _same_model(states)
    assert states[0]["step"] == 6 and states[0]["skipped_steps"] == 0


def test_a_missing_feature_cache_stops_every_process_at_once_naming_the_command(tmp_path: Path, tiny_run) -> None:
    """Building the cache in rank 0 would keep the others waiting for hours on COCO: refused up front."""
    out = tmp_path / "run"
    empty_root = tmp_path / "data"
    args = [*tiny_run.overrides, f"data.root={empty_root}", f"train.out_dir={out}", *RUN]
    done = launch(2, args, cwd=tmp_path, timeout=120)
    for d in done:
        assert d.returncode == 2, d.stderr[-2000:]
        lines = [line for line in d.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "no feature cache" in lines[0] and "captioning prepare-features" in lines[0]
    assert not empty_root.exists()  # nothing half made


@pytest.mark.slow
def test_a_process_that_waits_too_long_names_what_each_was_doing(tmp_path: Path, tiny_run) -> None:
    out = tmp_path / "run"
    args = [*tiny_run.overrides, f"train.out_dir={out}", *RUN, "train.eval_every_steps=2", "train.dist_timeout=5"]
    done = launch(2, args, cwd=tmp_path, fault="slow:0:2", sleep=12, timeout=120)  # rank 1 gives up after 5 s
    assert all(d.returncode == 2 for d in done), [d.stderr[-2000:] for d in done]
    waited = [line for line in done[1].stderr.splitlines() if line.startswith("error:")]
    assert len(waited) == 1, done[1].stderr[-2000:]
    assert "train.dist_timeout (5 s)" in waited[0] and "rank 0: validating at step 2" in waited[0], waited[0]


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_a_run_resumes_on_another_number_of_processes(tmp_path: Path, tiny_run, tiny_config, before: int,
                                                       after: int) -> None:
    whole = tmp_path / "whole"
    fit(tiny_config(whole, *RUN))
    reference = torch.load(whole / "last.pt", map_location="cpu", weights_only=True)

    out = tmp_path / "run"
    common = [*tiny_run.overrides, f"train.out_dir={out}", *RUN]
    first = launch(before, [*common, "train.max_steps=3"], cwd=tmp_path)
    assert all(d.returncode == 0 for d in first), [d.stderr[-2000:] for d in first]
    second = launch(after, ["--resume", *common], cwd=tmp_path)
    assert all(d.returncode == 0 for d in second), [d.stderr[-2000:] for d in second]
    resumed = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert resumed["progress"]["step"] == 6
    _close(reference["decoder"], resumed["decoder"])


@pytest.mark.slow
def test_fine_tuning_from_images_with_two_workers_per_process_ends(tmp_path: Path, tiny_run) -> None:
    out = tmp_path / "run"
    args = [*tiny_run.overrides, f"train.out_dir={out}", "train.max_steps=3", "train.val_images=4",
            "encoder.fine_tune_from=block4", "train.num_workers=2"]
    done = launch(2, args, cwd=tmp_path, timeout=240)
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    _same_model(_ranks(out))
    assert (out / "last.pt").exists() and "encoder" in torch.load(out / "last.pt", weights_only=True)


def test_the_launcher_sees_each_exit_code(tmp_path: Path) -> None:
    """The harness itself: a rank that fails is reported as failing (not as the group's success)."""
    done = launch(2, ["--config", os.devnull], cwd=tmp_path, timeout=60)
    assert all(d.returncode != 0 for d in done)


@pytest.mark.slow
def test_a_global_batch_smaller_than_the_processes_trains_as_in_one_process(tmp_path: Path, tiny_run,
                                                                             tiny_config) -> None:
    """120 pairs in batches of 7: the epoch's last global batch has one pair, so rank 1's part is
    empty; it steps on a stand-in that weighs nothing, and the update is the one-process update."""
    batches = ("train.batch_size=7", "data.bucket_batches=false", "train.max_steps=18")  # one epoch: 17x7 + 1
    whole = tmp_path / "whole"
    fit(tiny_config(whole, *RUN, *batches))
    out = tmp_path / "run"
    done = launch(2, [*tiny_run.overrides, f"train.out_dir={out}", *RUN, *batches], cwd=tmp_path)
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    _same_model(_ranks(out))
    one = torch.load(whole / "last.pt", map_location="cpu", weights_only=True)
    two = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert one["progress"]["step"] == two["progress"]["step"] == 18
    _close(one["decoder"], two["decoder"])


@pytest.mark.slow
def test_hard_attention_with_two_samples_trains_as_in_one_process(tmp_path: Path, tiny_run, tiny_config) -> None:
    """Every process draws the global batch's samples from one seed and keeps its rows' draws, and
    the REINFORCE baseline moves by the global batch's mean reward: two processes train the
    one-process weights and keep its baseline."""
    hard = (*RUN, "model.attention=hard", "train.reinforce.location_samples=2", "model.hard.expectation_prob=0.5")
    whole = tmp_path / "whole"
    fit(tiny_config(whole, *hard))
    out = tmp_path / "run"
    done = launch(2, [*tiny_run.overrides, f"train.out_dir={out}", *hard], cwd=tmp_path)
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    states = _ranks(out)
    _same_model(states)
    assert states[0]["baseline"] is not None and states[0]["baseline"] == states[1]["baseline"]
    one = torch.load(whole / "last.pt", map_location="cpu", weights_only=True)
    two = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert two["reinforce"]["baseline"] == states[0]["baseline"]
    assert two["reinforce"]["baseline"] == pytest.approx(one["reinforce"]["baseline"], rel=1e-4)
    _close(one["decoder"], two["decoder"])


@pytest.mark.slow
@pytest.mark.parametrize("limit, code", [("0.0", 2), ("0.5", 0)])
def test_unreadable_images_met_by_one_process_are_counted_and_judged_by_both(tmp_path: Path, tiny_run,
                                                                             limit: str, code: int) -> None:
    """With the encoder on the fly, each process meets the unreadable images of its own part; they
    are gathered, so both processes count the same images and stop (or go on) at the same step."""
    root = tmp_path / "data"
    shutil.copytree(tiny_run.data_root, root, ignore=shutil.ignore_patterns("features"))
    broken = sorted((root / "images" / "train").iterdir())[:3]
    for path in broken:
        path.write_bytes(path.read_bytes()[:50])  # truncated: unreadable
    out = tmp_path / "run"
    args = [*tiny_run.overrides, f"data.root={root}", f"train.out_dir={out}", *RUN, "train.max_steps=4",
            "data.feature_cache=false", f"data.max_bad_images={limit}", "train.val_images=2"]
    done = launch(2, args, cwd=tmp_path)
    assert [d.returncode for d in done] == [code, code], [d.stderr[-2000:] for d in done]
    if code:
        errors = [[line for line in d.stderr.splitlines() if line.startswith("error:")] for d in done]
        assert len(errors[0]) == 1 and errors[0] == errors[1] and "more than" in errors[0][0], errors
        return
    states = _ranks(out)
    _same_model(states)
    saved = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert saved["progress"]["skipped_images"] > 0  # the global batches' count, not rank 0's alone
    named = [line for line in done[0].stderr.splitlines() if "skipping an unreadable image" in line]
    assert len(named) == len(set(named)) and not any("skipping" in line for line in done[1].stderr.splitlines())


@pytest.mark.slow
def test_fp16_with_a_scaler_goes_on_after_each_step_the_processes_skip(tmp_path: Path, tiny_run) -> None:
    """train.amp on a GPU without native bf16 (V100, T4) under torchrun: fp16 with a GradScaler (here
    on the CPU). A step skipped because any process saw a non-finite value, or because the global
    batch was empty, must still end the scaler's iteration: the step after it used to raise
    "unscale_() has already been called on this optimizer since the last update()". Step 2: another
    process's loss is NaN, its gradients finite (the scale keeps its rule: no back-off); step 3: one
    process's batch is NaN, and DDP carries its NaN gradients to both (both scalers halve the scale);
    step 5: no process has an image (nothing to skip, nothing to step)."""
    out = tmp_path / "run"
    done = launch(2, [*tiny_run.overrides, f"train.out_dir={out}", *RUN, "train.amp=true"], cwd=tmp_path,
                  fault="nan:1:2,nanbatch:0:3,empty:all:5", fp16=True)
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    assert "precision: fp16 with a scaler" in done[0].stderr
    states = _ranks(out)
    _same_model(states)
    assert states[0]["step"] == 6 and states[0]["skipped_steps"] == 2
    assert states[0]["scaler"] == states[1]["scaler"] and states[0]["scaler"]["scale"] == 2.0**15
    saved = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    assert saved["progress"]["step"] == 6 and saved["scaler"]["scale"] == 2.0**15
    assert all(torch.isfinite(value).all() for value in saved["decoder"].values())


@pytest.mark.slow
def test_a_nan_batch_in_one_process_leaves_the_shared_baseline_as_it_was(tmp_path: Path, tiny_run) -> None:
    """Hard attention under torchrun: one process's batch is NaN at step 4, so the global batch's
    pooled reward is. Both processes skip the step, keep one baseline through it (it moves again on
    the next good batch), write a checkpoint without a NaN, and a run resumed from it trains."""
    from tests.train.test_reinforce import baseline_kept_through_the_skipped_step, finite_checkpoint

    out = tmp_path / "run"
    hard = [*tiny_run.overrides, f"train.out_dir={out}", *RUN, "model.attention=hard", "train.max_steps=7"]
    done = launch(2, hard, cwd=tmp_path, fault="nanbatch:1:4")
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    states = _ranks(out)
    _same_model(states)
    assert states[0]["skipped_steps"] == 1 and states[0]["baseline"] == states[1]["baseline"]
    baseline_kept_through_the_skipped_step(out / "log.jsonl", skipped=4)
    finite_checkpoint(out / "last.pt")
    resumed = launch(2, ["--resume", *hard, "train.max_steps=9"], cwd=tmp_path)
    assert [d.returncode for d in resumed] == [0, 0], [d.stderr[-2000:] for d in resumed]
    assert finite_checkpoint(out / "last.pt")["progress"]["step"] == 9


@pytest.mark.slow
def test_fine_tuning_on_the_frozen_stages_cache_with_an_empty_part_ends_with_one_model(tmp_path: Path, tiny_run,
                                                                                         tiny_config) -> None:
    """encoder.cache_frozen under torchrun: the cache of the frozen stages is built first, in one
    process (as a feature cache must be); the global batches of 7 leave rank 1 an empty part at the
    epoch's end, where it steps on a stand-in of the cache's shape, not of images."""
    from captioning.data.splits import load_splits

    frozen = ("encoder.fine_tune_from=block4", "encoder.cache_frozen=true", "train.batch_size=7",
              "data.bucket_batches=false", "train.max_steps=18", "train.val_images=4")
    load_splits(tiny_config(tmp_path / "prepare", *frozen), ("train", "val"))
    out = tmp_path / "run"
    done = launch(2, [*tiny_run.overrides, f"train.out_dir={out}", *RUN, *frozen], cwd=tmp_path, timeout=240)
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    states = _ranks(out)
    _same_model(states)
    assert states[0]["step"] == 18
    saved = torch.load(out / "last.pt", map_location="cpu", weights_only=True)["encoder"]
    assert any(name.startswith("body.block4.") for name in saved) and "body.block3.0.conv_pw.weight" in saved
