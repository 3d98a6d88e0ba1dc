"""The additive score's Triton kernels (captioning/model/score_kernels.py) measured against the
equations in float64, run by Triton's interpreter on the CPU: `python tests/model/interpreted_kernels.py`
prints one JSON object, each check's largest absolute error (tests/model/test_score_kernels.py
holds them to their tolerances).

Triton decides whether it interprets when it is first imported (its own standard functions, tl.sum
among them, are compiled or interpreted from then on), so this runs in a process of its own, with
TRITON_INTERPRET=1 set before anything imports Triton.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from captioning.model import fused, fused_check, score_kernels  # noqa: E402
from captioning.model.decoding import beam_search  # noqa: E402
from tests.model.test_fused import make_batch, make_decoder, outputs_and_gradients, stepwise  # noqa: E402

# sizes off the blocks (32 cells, 128 units): every edge mask is crossed
B, L, A = 3, 37, 150


def draw(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tanh(keys, queries):
    return torch.tanh(keys.double() + queries.double()[:, None, :])  # [n, L, A]


def error(got, want) -> float:
    """The largest absolute difference; NaN (and so a failed check) where the shapes differ."""
    if got.shape != want.shape:
        return float("nan")
    return float((got.detach().double() - want.detach().double()).abs().max())


def score_checks() -> dict[str, float]:
    errors = {}
    for group in (1, 3):
        keys, query, v = draw(B, L, A, seed=0), draw(B * group, A, seed=1), draw(A, seed=2)
        got = score_kernels.score(keys, query, v, group=group)
        errors[f"score, {group} rows an image"] = error(got, tanh(keys.repeat_interleave(group, 0), query) @ v.double())
        errors[f"score, {group} rows an image, float32 out"] = 0.0 if got.dtype == torch.float32 else float("nan")
    keys, query, v = draw(B, L, A, seed=3), draw(2, A, seed=4), draw(A, seed=5)
    errors["score of a running prefix"] = error(score_kernels.score(keys, query, v), tanh(keys[:2], query) @ v.double())
    d_e = draw(2, L, seed=9)
    t = tanh(keys[:2], query)
    errors["query's gradient"] = error(score_kernels.query_grad(keys, query, v, d_e),
                                       v.double() * (d_e.double()[:, :, None] * (1 - t * t)).sum(1))
    return errors


def summed(keys, queries, d_es, v, batch_sizes):
    """The keys' gradient [B, L, A] and v's [A] in float64, summed over every step of the packed
    positions (n_t in batch_sizes), as keys_and_v_grads computes them."""
    want_keys, want_v, start = torch.zeros(keys.shape, dtype=torch.float64), torch.zeros(A, dtype=torch.float64), 0
    for n in batch_sizes:
        t, d_e = tanh(keys[:n], queries[start:start + n]), d_es[start:start + n].double()[:, :, None]
        want_keys[:n] += d_e * (1 - t * t)
        want_v += (d_e * t).sum((0, 1))
        start += n
    return want_keys * v.double(), want_v


def summed_checks() -> dict[str, float]:
    errors = {}
    for name, batch_sizes in (("shrinking", [3, 2, 2, 1]), ("every row every step", [3, 3, 3])):
        total = sum(batch_sizes)
        keys, queries, d_es, v = draw(B, L, A, seed=10), draw(total, A, seed=11), draw(total, L, seed=12), draw(
            A, seed=13)
        want_keys, want_v = summed(keys, queries, d_es, v, batch_sizes)
        got_keys, got_v = score_kernels.keys_and_v_grads(keys, queries, d_es, v, batch_sizes)
        errors[f"keys' gradient, {name}"] = error(got_keys, want_keys)
        errors[f"v's gradient, {name}"] = error(got_v, want_v)
    return errors


def bf16_checks() -> dict[str, float]:
    """The kernels as bf16 autocast calls them (keys and queries in bf16, v and d_e in float32), against
    the equations in float64 on the same bf16 inputs: every sum is float32's, so the outputs that
    stay float32 are held to the float32 checks' tolerance; the keys' gradient, stored in the keys'
    dtype, is rounded once to bf16, so its error is taken relative to its size."""
    keys, queries, v = draw(B, L, A, seed=20).bfloat16(), draw(B * 3, A, seed=21).bfloat16(), draw(A, seed=22)
    d_es = draw(B * 3, L, seed=23)
    t = tanh(keys[:B], queries[:B])
    errors = {"bf16: score": error(score_kernels.score(keys, queries[:B], v), t @ v.double()),
              "bf16: score, 3 rows an image": error(score_kernels.score(keys, queries, v, group=3),
                                                    tanh(keys.repeat_interleave(3, 0), queries) @ v.double()),
              "bf16: query's gradient": error(score_kernels.query_grad(keys, queries[:B], v, d_es[:B]),
                                              v.double() * (d_es[:B].double()[:, :, None] * (1 - t * t)).sum(1))}
    sizes = [3, 2, 2, 1]
    positions = sum(sizes)
    got_keys, got_v = score_kernels.keys_and_v_grads(keys, queries[:positions], d_es[:positions], v, sizes)
    want_keys, want_v = summed(keys, queries, d_es, v, sizes)
    errors["bf16: keys' gradient in bf16"] = 0.0 if got_keys.dtype == torch.bfloat16 else float("nan")
    # Beyond one rounding to bf16: what the float32 sums add. The interpreter rounds toward zero, within
    # 2^-7 |x| (a GPU's conversion rounds to nearest, within 2^-8 |x|).
    errors["bf16: keys' gradient, past one rounding"] = float(
        ((got_keys.double() - want_keys).abs() - 2.0 ** -7 * want_keys.abs()).max())
    errors["bf16: v's gradient"] = error(got_v, want_v)
    return errors


def bf16_recurrence_checks() -> dict[str, float]:
    """The fused recurrence on the kernels under bf16 autocast, measured as tests/model/test_fused_precision.py
    measures it on PyTorch's score: against the float32 step-by-step equations, and beside torch's own bf16
    autocast of the step-by-step path."""
    from tests.model.test_fused_precision import _bf16_run, _relative

    seen = []  # the dtype of the keys each kernel is handed

    def recorded(kernel):
        return lambda keys, *rest, **options: seen.append(keys.dtype) or kernel(keys, *rest, **options)

    watched = types.SimpleNamespace(**{name: recorded(getattr(score_kernels, name))
                                       for name in ("score", "query_grad", "keys_and_v_grads")})
    fused.score_kernels = lambda device: watched
    errors = {}
    for seed in (0, 1):
        decoder = make_decoder(seed, dtype=torch.float32)
        batch = make_batch(seed, dtype=torch.float32)
        alphas, loss, grads = _bf16_run(decoder, batch, autocast=True)
        reference_alphas, reference_loss, reference_grads = _bf16_run(stepwise(decoder), batch, autocast=False)
        _, _, autocast_grads = _bf16_run(stepwise(decoder), batch, autocast=True)
        real = batch[3].bool()
        errors[f"bf16 recurrence {seed}: alphas"] = error(alphas[real], reference_alphas[real])
        errors[f"bf16 recurrence {seed}: loss, relative"] = abs(loss - reference_loss) / reference_loss
        errors[f"bf16 recurrence {seed}: gradients, relative"] = _relative(grads, reference_grads)
        errors[f"bf16 recurrence {seed}: autocast's gradients, relative"] = _relative(autocast_grads, reference_grads)
    bf16_calls = seen.count(torch.bfloat16)
    errors["bf16 recurrence: the kernels ran on bf16 keys"] = 0.0 if bf16_calls >= 3 else float("nan")
    return errors


def recurrence_checks() -> dict[str, float]:
    """The fused recurrence on the kernels against the step-by-step path, in float32 (the kernels sum
    in float32 whatever their inputs): logits, maps, loss and every gradient; packed by length, and
    without lengths (every row every step, as the graphed step runs)."""
    asked = []
    fused.score_kernels = lambda device: asked.append(device) or score_kernels
    decoder = make_decoder(9, dtype=torch.float32)
    batch = make_batch(9, dtype=torch.float32)
    try:
        output, loss, grads = outputs_and_gradients(decoder, *batch)
    except fused_check.FastPathError as refused:  # the fast path's check of itself saw the kernels go wrong
        print(refused, file=sys.stderr)
        return {"recurrence: the fast path's check of itself": float("nan")}
    expected, expected_loss, expected_grads = outputs_and_gradients(stepwise(decoder), *batch)
    real = batch[3].bool()
    errors = {"recurrence: the kernels were asked for": 0.0 if asked else float("nan"),
              "recurrence: logits": error(output.logits[real], expected.logits[real]),
              "recurrence: alphas": error(output.alphas[real], expected.alphas[real]),
              "recurrence: loss": error(loss, expected_loss)}
    names = ["annotations"] + [name for name, _ in decoder.named_parameters()]
    for name, got, want in zip(names, grads, expected_grads):
        errors[f"recurrence: gradient of {name}"] = error(got, want) / (1 + float(want.abs().max()))
    annotations, inputs = batch[0].clone().requires_grad_(), batch[1]
    twin_annotations = annotations.detach().clone().requires_grad_()
    every_step = decoder(annotations, inputs)
    twin = stepwise(decoder)(twin_annotations, inputs)
    (grad,) = torch.autograd.grad(every_step.logits.sum() + every_step.alphas.pow(2).sum(), [annotations])
    (want,) = torch.autograd.grad(twin.logits.sum() + twin.alphas.pow(2).sum(), [twin_annotations])
    errors["every row every step: logits"] = error(every_step.logits, twin.logits)
    errors["every row every step: gradient of the annotations"] = error(grad, want)
    # beam search's grouped step: K rows an image on the image's keys
    images = batch[0][:3]
    with torch.no_grad():
        got, expected = beam_search(decoder, images, beam_size=3, max_length=6), beam_search(
            stepwise(decoder), images, beam_size=3, max_length=6)
    errors["recurrence: beam search's words"] = 0.0 if torch.equal(got.tokens, expected.tokens) else float("nan")
    errors["recurrence: beam search's maps"] = error(got.alphas, expected.alphas)
    return errors


if __name__ == "__main__":
    # The interpreter computes masked-off lanes too, on whatever memory lies there, then drops them:
    # numpy's overflow warnings from those lanes say nothing about the kept ones.
    with np.errstate(over="ignore", invalid="ignore"):
        print(json.dumps({**score_checks(), **summed_checks(), **bf16_checks(), **recurrence_checks(),
                          **bf16_recurrence_checks()}))
