"""best.pt holds the model the run's record calls best: after a kill between a save's two files,
when the kept metric is not measured (NaN) at a validation, and when a run is resumed at its step
limit. The validation metric is given here (tiny runs' own numbers sit near zero); everything else
is a real run: 8 batches per epoch, a validation at each epoch's end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import captioning.train.loop as training
from captioning.checkpoint import load_checkpoint
from captioning.cli import train_main
from captioning.train.loop import fit
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
    _metric_per_validation(monkeypatch, [math.nan, 0.5, math.nan, math.nan, 0.3])
    out = tmp_path / "run"
    summary = fit(tiny_config(out, "train.max_steps=40", "train.lr_patience=1", "train.early_stop_patience=2"))
    assert summary["steps"] == 40  # two NaN in a row would have stopped it early at step 32
    history = load_checkpoint(out / "last.pt")["progress"]["history"]
    assert [entry["lr"] for entry in history] == [0.01] * 5  # one stale value (0.3) is within the patience
    assert load_checkpoint(out / "best.pt")["progress"]["step"] == 16
    assert load_checkpoint(out / "last.pt")["progress"]["stale_evaluations"] == 1

    _metric_per_validation(monkeypatch, [math.nan, math.nan])
    never = tmp_path / "never"
    assert train_main(["--device", "cpu", f"data.root={shapes_root}", *TINY, f"train.out_dir={never}",
                       "train.max_steps=16"]) == 1
    assert not (never / "best.pt").exists() and (never / "last.pt").exists()
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: train.val_metric CIDEr was not measured (NaN) at any validation, so no best.pt was kept; "
        f"{never / 'last.pt'} holds the 16 steps trained: choose another val_metric and go on with --resume")


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
    and best.pt stayed the CIDEr run's for good while the rate decayed and early stopping came."""
    _metric_per_validation(monkeypatch, [0.1, 0.5, 0.3, 0.2])
    out = tmp_path / "run"
    fit(tiny_config(out, "train.max_steps=16"))
    capsys.readouterr()
    fit(tiny_config(out, "train.max_steps=32", "train.val_metric=Bleu_4", "train.lr_patience=0"), resume=True)
    assert capsys.readouterr().err.splitlines()[0] == (
        "resume: validation train.val_metric: 'CIDEr' -> 'Bleu_4': the best so far was measured otherwise, so it is "
        "measured anew and the next validation replaces best.pt")
    progress = load_checkpoint(out / "last.pt")["progress"]
    assert load_checkpoint(out / "best.pt")["progress"]["step"] == 24  # BLEU-4 0.03, then 0.02
    assert progress["best_metric"] == pytest.approx(0.03) and progress["stale_evaluations"] == 1
    assert [entry["lr"] for entry in progress["history"]] == [0.01, 0.01, 0.01, 0.005]  # patience 0: one stale


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
])
def test_a_validation_is_another_where_its_number_depends_on_what_changed(tiny_config, tmp_path: Path, override: str,
                                                                          another: bool) -> None:
    """A resume measures the best anew where the validation changed, and only there: best.pt would
    otherwise be replaced at the next validation for a setting that moves no validation's number."""
    before, now = validation_protocol(tiny_config(tmp_path)), validation_protocol(tiny_config(tmp_path, override))
    assert (before != now) == another
