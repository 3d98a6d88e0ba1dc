"""The fast path proves itself: an edit to the step-by-step modules that the fused path does not
copy stops a run with one line naming the difference and model.fused=false, in training and in
decoding alike; so does a fault in the fused path's own hand-written backward."""

from __future__ import annotations

import pytest
import torch

from captioning.model import fused, fused_check, paper
from captioning.model.decoding import beam_search, greedy
from captioning.model.fused_check import FastPathError
from captioning.runtime.precision import allow_tf32
from tests.model.test_fused import LENGTHS, loss_of, make_batch, make_decoder


def _relu_score(self, keys, hidden):  # the edit a researcher might make in place: tanh -> relu
    return self.v(torch.relu(keys + self.query(hidden)[:, None, :])).squeeze(2)


def test_an_agreeing_fast_path_trains_and_decodes_and_is_proven_once(monkeypatch):
    decoder = make_decoder(dtype=torch.float32)
    annotations, inputs, targets, mask = make_batch(dtype=torch.float32)
    calls = []
    real = fused.recurrence
    monkeypatch.setattr(fused, "recurrence", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(2):
        loss_of(decoder(annotations, inputs, lengths=LENGTHS), targets, mask).backward()
    assert len(calls) == 3  # the check's one call, then the two steps': the check ran once
    assert decoder in fused_check._proven["recurrence"]
    beam_search(decoder.eval(), annotations, beam_size=2, max_length=4)
    assert decoder in fused_check._proven["grouped"]


def test_an_edited_score_stops_training_with_one_line_naming_the_way_out(monkeypatch):
    monkeypatch.setattr(paper.AdditiveScore, "forward", _relu_score)
    decoder = make_decoder(dtype=torch.float32)
    annotations, inputs, _, _ = make_batch(dtype=torch.float32)
    with pytest.raises(FastPathError, match=r"disagree on h_t \(teacher forcing\) by .*model\.fused=false") as error:
        decoder(annotations, inputs, lengths=LENGTHS)
    assert "\n" not in str(error.value)
    decoder.accelerator = None  # the way out the line names (model.fused=false builds none): step by step
    decoder(annotations, inputs, lengths=LENGTHS)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_an_edited_score_stops_decoding(monkeypatch, search):
    monkeypatch.setattr(paper.AdditiveScore, "forward", _relu_score)
    decoder = make_decoder(dtype=torch.float32).eval()
    annotations = make_batch(dtype=torch.float32)[0]
    with pytest.raises(FastPathError, match=r"logits \(one decoding step\).*model\.fused=false"):
        if search == "greedy":
            greedy(decoder, annotations, max_length=4)
        else:
            beam_search(decoder, annotations, beam_size=2, max_length=4)


def test_a_fault_in_the_hand_written_backward_is_caught_by_the_gradients(monkeypatch):
    real = fused.FusedRecurrence.backward

    def skewed(ctx, *grads):
        out = list(real(ctx, *grads))
        out[5] = out[5] * 1.01  # d[W_h; W_beta; W_hh], 1% off: values agree, gradients do not
        return tuple(out)

    monkeypatch.setattr(fused.FusedRecurrence, "backward", staticmethod(skewed))
    decoder = make_decoder(dtype=torch.float32)
    annotations, inputs, _, _ = make_batch(dtype=torch.float32)
    with pytest.raises(FastPathError, match="the gradient of"):
        decoder(annotations, inputs, lengths=LENGTHS)


def test_a_float64_decoder_is_checked_in_its_own_dtype():
    decoder = make_decoder()  # float64, as the fused tests build it
    annotations, inputs, _, _ = make_batch()
    decoder(annotations, inputs, lengths=LENGTHS)
    assert decoder in fused_check._proven["recurrence"]


def test_the_checks_run_without_tf32_and_leave_it_as_the_run_set_it(monkeypatch):
    """On a GPU, a run's fp32 matmuls are TF32 (train.tf32): ~1e-3 apart between the two paths, ten
    times the tolerance. The checks hold the equations, so they compute in full float32, and the run
    gets its TF32 back after them, after a failed one too."""
    seen = []
    real_recurrence, real_step = fused.recurrence, fused.GroupedStep.__call__

    def flags() -> tuple[bool, bool]:
        return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    monkeypatch.setattr(fused, "recurrence", lambda *a, **k: seen.append(("recurrence", flags()))
                        or real_recurrence(*a, **k))
    monkeypatch.setattr(fused.GroupedStep, "__call__", lambda *a, **k: seen.append(("grouped", flags()))
                        or real_step(*a, **k))
    before = flags()
    allow_tf32(True)  # as a run's train.tf32 sets it
    try:
        decoder = make_decoder(dtype=torch.float32)
        annotations = make_batch(dtype=torch.float32)[0]
        fused_check.prove_recurrence(decoder, annotations)
        fused_check.prove_grouped_step(decoder, annotations)
        assert seen == [("recurrence", (False, False)), ("grouped", (False, False))]
        assert flags() == (True, True)

        monkeypatch.setattr(paper.AdditiveScore, "forward", _relu_score)
        with pytest.raises(FastPathError):
            fused_check.prove_recurrence(make_decoder(dtype=torch.float32), annotations)
        assert flags() == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
