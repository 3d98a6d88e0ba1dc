"""The additive score's Triton kernels (captioning/model/score_kernels.py) on the CPU, in Triton's
interpreter: tests/model/interpreted_kernels.py measures each kernel against the equations in
float64, and the fused recurrence on them against the step-by-step path, in a process of its own
(Triton decides whether it interprets when it is first imported); each check is held here to its
tolerance. On a GPU the same kernels are compiled: the fast path's check of itself runs them
before a run's first step (captioning/model/fused_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.tiny import REPO

# float32 sums of ~150 products of O(1) terms: rounding near 1e-5; a wrong index or mask is O(1)
KERNEL = 2e-5
# the recurrence in float32 on either path: as tests/model/test_fused.py's float32 comparison
RECURRENCE = 1e-4


@pytest.fixture(scope="module")
def errors() -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "model" / "interpreted_kernels.py")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_kernels_compute_the_score_and_its_gradients(errors):
    kernels = {name: value for name, value in errors.items() if not name.startswith(("recurrence", "every row"))}
    assert len(kernels) == 10
    for name, value in kernels.items():
        assert value <= KERNEL * (10 if name.startswith("v's") else 1), name  # v's sums over every position


def test_the_fused_recurrence_on_the_kernels_equals_the_stepwise_one(errors):
    recurrence = {name: value for name, value in errors.items() if name.startswith(("recurrence", "every row"))}
    assert len(recurrence) >= 6 and "recurrence: the kernels were asked for" in recurrence, recurrence
    for name, value in recurrence.items():
        assert value <= RECURRENCE, name


def test_kernels_that_do_not_run_here_leave_the_score_to_pytorch(monkeypatch):
    """Asked for the kernels where Triton cannot run them (here: the CPU's tensors, outside the
    interpreter; on a GPU: one older than Triton supports), the fused path says so once and computes
    the score in PyTorch, to the same numbers."""
    from captioning.model import fused

    monkeypatch.setattr(fused, "KERNELS_ON", frozenset({"cpu"}))
    monkeypatch.setattr(fused, "_kernels_ran", {})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.warns(RuntimeWarning, match="Triton kernels do not run on this cpu"):
        assert fused.score_kernels("cpu") is None
    assert fused._kernels_ran == {"cpu": False}  # tried once a process
    import warnings

    from tests.model.test_fused import make_batch, make_decoder, stepwise

    decoder = make_decoder(11, dtype=torch.float32)
    annotations, inputs, _, _ = make_batch(11, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: not again at every step
        got = decoder(annotations, inputs)
    torch.testing.assert_close(got.alphas, stepwise(decoder)(annotations, inputs).alphas, rtol=1e-5, atol=1e-6)
