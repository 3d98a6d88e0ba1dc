"""The fused recurrence's two arrangements for a GPU (captioning/model/fused.py): the score's tanh
computed again in the backward instead of kept, and bf16 through the recurrence under bf16 autocast.

The first must give the kept path's numbers (float64, to rounding) and torch's numerical
derivatives (gradcheck). The second is held to the paper's equations in float32, the step-by-step
path without autocast, at a tolerance set by bf16's own precision: its unit roundoff u = 2^-8 (8
significant bits). Every value the recurrence hands on (alpha, the loss) must be within u of the
float32 one, and every gradient no farther from float32 than torch's own bf16 autocast of the
step-by-step path is: the arithmetic `train.amp` ran before the fused path took bf16.
"""

from __future__ import annotations

import pytest
import torch

from captioning.model import fused
from tests.model.test_fused import LENGTHS, loss_of, make_batch, make_decoder, outputs_and_gradients, stepwise

UNIT_ROUNDOFF = 2.0 ** -8  # bf16: 8 significant bits


@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_recomputing_the_score_in_the_backward_gives_the_kept_paths_gradients(monkeypatch, gate):
    decoder = make_decoder(8, gate=gate)
    annotations, inputs, targets, mask = make_batch(5)
    kept = outputs_and_gradients(decoder, annotations, inputs, targets, mask)
    monkeypatch.setattr(fused, "RECOMPUTED_ON", frozenset({"cpu"}))
    recomputed = outputs_and_gradients(decoder, annotations, inputs, targets, mask)
    stepped = outputs_and_gradients(stepwise(decoder), annotations, inputs, targets, mask)
    torch.testing.assert_close(recomputed[1], kept[1], rtol=1e-12, atol=1e-12)
    for got, want, reference in zip(recomputed[2], kept[2], stepped[2]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got, reference, rtol=1e-9, atol=1e-12)


def test_the_recomputing_backward_passes_gradcheck(monkeypatch):
    """torch's numerical derivatives of every input of the Function, the batch sizes shrinking."""
    generator = torch.Generator().manual_seed(3)
    batch, cells, att, dim, hid, width = 3, 4, 5, 3, 4, 1
    sizes = [3, 2, 2, 1]

    def draw(*shape):
        return (0.5 * torch.randn(*shape, generator=generator, dtype=torch.float64)).requires_grad_()

    inputs = (draw(batch, cells, att), draw(batch, cells, dim), draw(sum(sizes), 4 * hid), draw(batch, hid),
              draw(batch, hid), draw(att + width + 4 * hid, hid), draw(width), draw(att), draw(4 * hid, dim))
    assert torch.autograd.gradcheck(lambda *x: fused.FusedRecurrence.apply(*x, sizes, True, True), inputs)


def _bf16_run(decoder, batch, *, autocast: bool):
    annotations, inputs, targets, mask = batch
    annotations = annotations.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        output = decoder(annotations, inputs, lengths=LENGTHS)
    loss = loss_of(output, targets, mask).float()
    grads = torch.autograd.grad(loss, [annotations, *decoder.parameters()])
    return output.alphas.float().detach(), float(loss.detach()), torch.cat([g.float().flatten() for g in grads])


def _relative(got, want) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bf16_through_the_recurrence_stays_within_bf16s_precision_of_the_float32_equations(seed):
    decoder = make_decoder(seed, dtype=torch.float32)
    batch = make_batch(seed, dtype=torch.float32)
    alphas, loss, grads = _bf16_run(decoder, batch, autocast=True)
    reference_alphas, reference_loss, reference_grads = _bf16_run(stepwise(decoder), batch, autocast=False)
    _, _, autocast_grads = _bf16_run(stepwise(decoder), batch, autocast=True)
    fused_float32, _, _ = _bf16_run(decoder, batch, autocast=False)
    assert (alphas - fused_float32).abs().max() > 20 * torch.finfo(torch.float32).eps  # bf16 did run
    real = batch[3].bool()
    assert (alphas[real] - reference_alphas[real]).abs().max() <= UNIT_ROUNDOFF
    assert abs(loss - reference_loss) <= UNIT_ROUNDOFF * reference_loss
    # every gradient as one vector: the direction an update takes
    assert _relative(grads, reference_grads) <= max(_relative(autocast_grads, reference_grads), UNIT_ROUNDOFF)


@pytest.mark.parametrize("autocast, computed", [(None, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                (torch.float16, torch.float32)])
def test_only_bf16_autocast_takes_the_recurrence_below_float32(monkeypatch, autocast, computed):
    """fp16's range (65 504) is one a recurrence of 20 steps can leave, and fp16 autocast comes with a
    loss scale that multiplies the gradients: under it the recurrence stays in float32."""
    seen = []
    real = fused.FusedRecurrence.apply
    monkeypatch.setattr(fused.FusedRecurrence, "apply",
                        lambda keys, *rest: seen.append(keys.dtype) or real(keys, *rest))
    decoder = make_decoder(4, dtype=torch.float32)
    annotations, inputs, _, _ = make_batch(4, dtype=torch.float32)
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        output = decoder(annotations, inputs, lengths=LENGTHS)
    assert seen[-1] == computed  # (the first call: the fast path's check of itself, in float32)
    assert output.alphas.dtype == torch.float32  # what the loss reads
