"""best.pt holds the model the run's record calls best: after a kill between a save's two files,
when the kept metric is not measured (NaN) at a validation, and when a run is resumed at its step
limit. The validation metric is given here (tiny runs' own numbers sit near zero); everything else
is a real run: 8 batches per epoch, a validation at each epoch's end."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

import captioning.train.loop as training
from captioning.checkpoint import load_checkpoint, save_checkpoint
from captioning.cli import train_main
from captioning.runtime.hardware import Hardware
from captioning.train.loop import Run, fit
from captioning.train.validation import validation_protocol
from tests.tiny import TINY


class Killed(BaseException):
    """SIGKILL, in-process: nothing after it runs but the `finally` clauses."""


def _metric_per_validation(monkeypatch, values: list[float]) -> list[float]:
    """The runs' validations score, in turn, these values of CIDEr, and a tenth of each as BLEU-4."""
    given = iter(values)

    def metrics(*args, **kwargs) -> dict[str, float]:
        value = next(given)
        return {"CIDEr": value, "Bleu_4": value / 10}

    monkeypatch.setattr(training, "validation_metrics", metrics)
    return values


def _validations(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [line for line in lines if "validation" in line]


def test_a_kill_between_a_saves_two_files_leaves_best_pt_the_model_last_pt_calls_best(tmp_path: Path, tiny_config,
                                                                                    monkeypatch) -> None:
    """last.pt records the best metric so far; written before best.pt, a kill between the two left a
    last.pt that named a better model than best.pt held, and the resumed run, which only replaces best.pt
    on a value above the recorded one, kept the older model in best.pt for the rest of the run."""
    _metric_per_validation(monkeypatch, [0.1, 0.5, 0.5])  # steps 8, 16, and 16 again on the resume
    real, saved = training.save_checkpoint, []

    def killed_between_the_two_files(path, payload):
        step = payload["progress"]["step"]
        if step == 16 and step in saved:
            raise Killed
        saved.append(step)
        real(path, payload)

    monkeypatch.setattr(training, "save_checkpoint", killed_between_the_two_files)
    out = tmp_path / "run"
    config = tiny_config(out, "train.max_steps=16")
    with pytest.raises(Killed):
        fit(config)
    monkeypatch.setattr(training, "save_checkpoint", real)
    fit(config, resume=True)
    last, best = load_checkpoint(out / "last.pt")["progress"], load_checkpoint(out / "best.pt")["progress"]
    assert last["step"] == best["step"] == 16
    assert last["best_metric"] == best["best_metric"] == 0.5


def test_a_metric_not_measured_is_neither_better_nor_worse(tmp_path: Path, tiny_config, shapes_root: Path,
                                                           monkeypatch, capsys) -> None:
    """NaN (attention_correctness on data without boxes, relation_accuracy before a caption names a
    relation) counted as a stale validation: the rate decayed and early stopping came nearer, with no
    best.pt, while the last line named one."""
    _metric_per_validation(monkeypatch, [math.nan, 0.5, math.nan, math.nan, 0.3,  # the first run
                                         math.nan, math.nan,  # a new run, never measured
                                         0.2])  # that one resumed with another metric: its model, first
    out = tmp_path / "run"
    summary = fit(tiny_config(out, "train.max_steps=40", "train.lr_patience=1", "train.early_stop_patience=2"))
    assert summary["steps"] == 40  # two NaN in a row would have stopped it early at step 32
    history = load_checkpoint(out / "last.pt")["progress"]["history"]
    assert [entry["lr"] for entry in history] == [0.01] * 5  # one stale value (0.3) is within the patience
    assert load_checkpoint(out / "best.pt")["progress"]["step"] == 16
    assert load_checkpoint(out / "last.pt")["progress"]["stale_evaluations"] == 1

    # A run whose metric is never measured keeps no best: neither its exit code nor its last line may
    # name a best.pt.
    out = tmp_path / "never"
    args = ["--device", "cpu", f"data.root={shapes_root}", *TINY, f"train.out_dir={out}", "train.max_steps=16"]
    capsys.readouterr()
    assert train_main(args) == 1
    assert not (out / "best.pt").exists()
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: train.val_metric CIDEr was not measured (NaN) at any validation, so this run kept no best.pt; "
        f"{out / 'last.pt'} holds the 16 steps trained: go on with --resume and another train.val_metric, which "
        "validates it first")
    # What the line says to do: the resume is at its step limit, and validates the model it holds first.
    assert train_main(["--resume", *args, "train.val_metric=Bleu_4"]) == 0
    best = load_checkpoint(out / "best.pt")["progress"]
    assert (best["step"], best["best_metric"]) == (16, pytest.approx(0.02))
    assert [entry["step"] for entry in best["history"]] == [8, 16, 16]


def test_a_run_resumed_at_its_step_limit_is_not_validated_twice(tmp_path: Path, tiny_config, monkeypatch) -> None:
    """A last.pt at the step limit was written by the validation there: another one logged the step
    twice and counted it stale, a decay of the rate and a step nearer the early stop."""
    _metric_per_validation(monkeypatch, [0.5, 0.1, 0.1])
    out = tmp_path / "run"
    config = tiny_config(out, "train.max_steps=16", "train.lr_patience=0")
    fit(config)
    before = load_checkpoint(out / "last.pt")["progress"]
    assert fit(config, resume=True)["steps"] == 16
    after = load_checkpoint(out / "last.pt")["progress"]
    assert after["history"] == before["history"] and after["stale_evaluations"] == before["stale_evaluations"] == 1
    assert [entry["step"] for entry in _validations(out)] == [8, 16]



def test_a_resume_that_validates_otherwise_measures_the_best_anew(tmp_path: Path, tiny_config, monkeypatch,
                                                                 capsys) -> None:
    """The best so far was CIDEr; compared with it, a BLEU-4 (a tenth of the scale) was never better,
    and best.pt stayed the CIDEr run's for good while the rate decayed and early stopping came. The
    checkpoint's model is measured first: at its step limit, the run would validate no more."""
    _metric_per_validation(monkeypatch, [0.1, 0.5, 0.3, 0.2, 0.4])
    out = tmp_path / "run"
    fit(tiny_config(out, "train.max_steps=16"))
    capsys.readouterr()
    fit(tiny_config(out, "train.max_steps=32", "train.val_metric=Bleu_4", "train.lr_patience=0"), resume=True)
    assert capsys.readouterr().err.splitlines()[0] == (
        "resume: validation train.val_metric: 'CIDEr' -> 'Bleu_4': the best so far was measured otherwise, so it is "
        "measured anew and the next validation replaces best.pt")
    progress = load_checkpoint(out / "last.pt")["progress"]
    assert [entry["step"] for entry in progress["history"]] == [8, 16, 16, 24, 32]  # step 16 under each metric
    assert load_checkpoint(out / "best.pt")["progress"]["step"] == 32  # BLEU-4 0.03, 0.02, then 0.04
    assert progress["best_metric"] == pytest.approx(0.04) and progress["stale_evaluations"] == 0
    assert [entry["lr"] for entry in progress["history"]] == [0.01, 0.01, 0.01, 0.005, 0.005]  # patience 0

    _metric_per_validation(monkeypatch, [0.6])  # at the limit, under yet another validation: measured, kept
    fit(tiny_config(out, "train.max_steps=32", "train.val_metric=CIDEr"), resume=True)
    best = load_checkpoint(out / "best.pt")["progress"]
    assert (best["step"], best["best_metric"], len(best["history"])) == (32, 0.6, 6)


def test_a_run_validated_before_the_unk_rule_is_measured_anew_under_it(tiny_run, tiny_config, tmp_path: Path,
                                                                       capsys) -> None:
    """A checkpoint's record that names no <unk> rule was validated with <unk> allowed (verify reads it
    so: train/verify.as_validated); its config, read today, says the default, blocked."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, out)
    payload = load_checkpoint(out / "last.pt")
    validation = {k: v for k, v in payload["record"]["validation"].items() if k != "allow_unk"}
    save_checkpoint(out / "last.pt", {**payload, "record": {**payload["record"], "validation": validation}})
    run = Run.start(tiny_config(out), resume=True, hardware=Hardware.setup("cpu", amp=False))
    try:
        assert run.measure_anew and run.progress.best_metric == -math.inf
    finally:
        run.close()
    assert "validation decode.allow_unk: True -> False: " in capsys.readouterr().err


@pytest.mark.parametrize(("override", "another"), [
    ("decode.beam_size=5", False),  # validation is greedy (train.val_beam_size=1): the beam is evaluation's
    ("decode.length_penalty=0.7", False),  # greedy ranks no finished beams
    ("train.lr=0.5", False),
    ("train.early_stop_patience=9", False),
    ("train.val_beam_size=null", True),  # now decode.beam_size, 2
    ("train.val_metric=Bleu_4", True),
    ("train.val_images=3", True),
    ("train.val_tokenizer=ptb", True),
    ("decode.max_length=9", True),
    ("decode.no_repeat_ngram=2", True),
    ("data.language=de", True),  # tokenized and scored otherwise
])
def test_a_validation_is_another_where_its_number_depends_on_what_changed(tiny_config, tmp_path: Path, override: str,
                                                                          another: bool) -> None:
    """A resume measures the best anew where the validation changed, and only there: best.pt would
    otherwise be replaced at the next validation for a setting that moves no validation's number."""
    before, now = validation_protocol(tiny_config(tmp_path)), validation_protocol(tiny_config(tmp_path, override))
    assert (before != now) == another


def test_every_process_of_a_run_that_kept_no_best_exits_alike(monkeypatch, capsys) -> None:
    """Under torchrun the best metric is broadcast, so every process knows that none was measured;
    rank 0 alone says so, and all exit 1 (torchrun would otherwise report rank 0 alone as failed)."""
    summary = {"best": None, "best_metric": -math.inf, "metric": "CIDEr", "steps": 16, "seconds": 1.0,
               "last": "runs/x/last.pt", "interrupted": None, "skipped_images": 0}
    monkeypatch.setattr(training, "fit", lambda config, **kwargs: summary)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, says in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        assert train_main(["--device", "cpu"]) == 1
        assert ("kept no best.pt" in capsys.readouterr().err) == says
