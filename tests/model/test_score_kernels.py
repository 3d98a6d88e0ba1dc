"""The additive score's Triton kernels (captioning/model/score_kernels.py) on the CPU, in Triton's
interpreter: tests/model/interpreted_kernels.py measures each kernel against the equations in
float64, and the fused recurrence on them against the step-by-step path, in a process of its own
(Triton decides whether it interprets when it is first imported); each check is held here to its
tolerance. On a GPU the same kernels are compiled: the fast path's check of itself runs them
before a run's first step (captioning/model/fused_check.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.model.test_fused_precision import UNIT_ROUNDOFF
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
    """In float32, and as bf16 autocast hands them bf16 keys and queries: every sum is float32's either way."""
    kernels = {name: value for name, value in errors.items()
               if not name.startswith(("recurrence", "every row", "bf16 recurrence"))}
    assert len(kernels) == 16 and sum(name.startswith("bf16") for name in kernels) == 6
    for name, value in kernels.items():
        assert value <= KERNEL * (10 if "v's" in name else 1), name  # v's sums over every position


def test_bf16_on_the_kernels_stays_within_bf16s_precision_of_the_float32_equations(errors):
    """The bounds tests/model/test_fused_precision.py holds PyTorch's bf16 score to, on the kernels:
    alphas within u = 2^-8 and the loss within u relative of the float32 step-by-step path, and the
    gradients no farther from it than torch's own bf16 autocast of that path."""
    assert errors["bf16 recurrence: the kernels ran on bf16 keys"] == 0.0
    for seed in (0, 1):
        measured = {name.split(": ", 1)[1]: value for name, value in errors.items()
                    if name.startswith(f"bf16 recurrence {seed}:")}
        assert measured["alphas"] <= UNIT_ROUNDOFF
        assert measured["loss, relative"] <= UNIT_ROUNDOFF
        assert measured["gradients, relative"] <= max(measured["autocast's gradients, relative"], UNIT_ROUNDOFF)


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


class _Launches:
    """Stands in for score_kernels' three kernels: each launch is recorded as Triton's compiler would
    key it (a type for each argument, the block sizes as constants), and nothing runs."""

    def __init__(self, monkeypatch):
        from triton.runtime.jit import mangle_type

        from captioning.model import score_kernels

        seen: dict[tuple, tuple] = {}  # (kernel, signature) -> (kernel, signature, constants)
        self.seen = seen

        class Recorded:
            def __init__(self, kernel):
                self.kernel = kernel

            def __getitem__(self, grid):  # kernel[grid](*args, **constants), as Triton launches
                return self.launch

            def launch(self, *args, **constants):
                signature = {**{name: mangle_type(arg) for name, arg in zip(self.kernel.arg_names, args)},
                             **{name: "constexpr" for name in constants}}
                seen[(self.kernel.__name__, tuple(signature.items()))] = (self.kernel, signature, constants)

        for name in ("_score_kernel", "_query_grad_kernel", "_keys_grad_kernel"):
            monkeypatch.setattr(score_kernels, name, Recorded(getattr(score_kernels, name)))

    def of_keys(self, dtype: str) -> set[str]:
        return {name for name, signature in self.seen if dict(signature)["keys"] == dtype}


def test_the_probe_launches_each_kernel_in_float32_and_bf16(monkeypatch):
    """What fails to compile on a GPU must fail in the probe, before the first step, and not at the
    first bf16 step: the probe launches the dtypes a run hands the kernels."""
    from captioning.model import fused

    launches = _Launches(monkeypatch)
    monkeypatch.setattr(fused, "KERNELS_ON", frozenset({"cpu"}))
    monkeypatch.setattr(fused, "_kernels_ran", {})
    assert fused.score_kernels("cpu") is not None
    kernels = {"_score_kernel", "_query_grad_kernel", "_keys_grad_kernel"}
    assert launches.of_keys("*fp32") == kernels and launches.of_keys("*bf16") == kernels


@pytest.mark.parametrize("arch", [80, 90])  # A100; H100 and H200
def test_every_launch_the_fused_path_makes_compiles_for_the_gpu(monkeypatch, tmp_path, arch):
    """Triton compiles for a GPU it is told of, to the GPU's binary (cubin, through ptxas), without
    one: every kernel in every dtype that the fused recurrence (forward and backward) and beam search
    hand it, in float32 and under bf16 autocast, recorded from those paths on the CPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from captioning.model import fused, fused_check
    from captioning.model import score_kernels as kernels
    from captioning.model.decoding import beam_search
    from tests.model.test_fused import LENGTHS, make_batch, make_decoder

    launches = _Launches(monkeypatch)
    monkeypatch.setattr(fused, "score_kernels", lambda device: kernels)
    monkeypatch.setattr(fused_check, "prove_recurrence", lambda *args: None)  # it compares values; none are computed
    monkeypatch.setattr(fused_check, "prove_grouped_step", lambda *args: None)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compiled here, not found in a cache
    decoder = make_decoder(0, dtype=torch.float32)
    annotations, inputs, _, _ = make_batch(0, dtype=torch.float32)
    for bf16 in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            output = decoder(annotations.clone().requires_grad_(), inputs, lengths=LENGTHS)
            output.logits.float().sum().backward()
            with torch.no_grad():
                beam_search(decoder, annotations[:2], beam_size=3, max_length=4)
    assert len(launches.seen) == 6 and launches.of_keys("*bf16") == launches.of_keys("*fp32")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"  # Triton's own
    for kernel, signature, constants in launches.seen.values():
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                                  target=GPUTarget("cuda", arch, 32))
        assert f".target sm_{arch}" in compiled.asm["ptx"] and compiled.asm["cubin"]
        binary = tmp_path / f"{kernel.__name__}.cubin"
        binary.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(binary)], capture_output=True,
                               text=True, check=True).stdout
        # registers that do not fit spill to local memory, which is as slow as the global memory the kernels
        # exist to spare: every tile must stay in registers
        assert re.search(r"REG:\d+ STACK:0 SHARED:\d+ LOCAL:0 ", usage), (kernel.__name__, signature["keys"], usage)
    assert any(tmp_path.iterdir())
