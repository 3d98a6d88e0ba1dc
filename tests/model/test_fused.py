"""The fused paths against the straightforward implementation kept in benchmarks/reference.py.

Same logits, alphas, losses and gradients for teacher forcing, with padding, mixed and unsorted
lengths, both gates, the fused path and the step-by-step one; same beams for beam search.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import reference
from captioning.data.vocab import Vocabulary
from captioning.model import fused
from captioning.model.attention import SoftAttention
from captioning.model.decoder import AttentionDecoder
from captioning.model.decoding import beam_search, greedy
from captioning.model.extras.position import GridCoordinates
from captioning.model.scores import AdditiveScore
from captioning.train.losses import cross_entropy, doubly_stochastic

B, L, D, E, H, A, V, T = 5, 9, 8, 6, 16, 7, 11, 7
LENGTHS = torch.tensor([3, 7, 1, 5, 7])  # unsorted, with ties, a one-step row and full-length rows


class PlainSoftAttention(SoftAttention):
    """The same attention under another type: the decoder cannot recognize it, so it steps through `_advance`."""


def make_decoder(seed: int = 0, *, gate: str = "scalar", plain: bool = False, dtype=torch.float64,
                 dropout: float = 0.0) -> AttentionDecoder:
    torch.manual_seed(seed)
    attention = SoftAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=A))
    if plain:
        attention = PlainSoftAttention(attention.score)
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=E, hidden_dim=H, attention=attention,
                               gate=gate, dropout=dropout)
    return decoder.to(dtype)


def make_batch(seed: int = 1, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    annotations = torch.randn(B, L, D, generator=generator, dtype=dtype)
    tokens = torch.randint(4, V, (B, T + 1), generator=generator)
    tokens[:, 0] = Vocabulary.start_id
    for row, n in enumerate(LENGTHS.tolist()):
        tokens[row, n] = Vocabulary.end_id
        tokens[row, n + 1:] = Vocabulary.pad_id
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mask = (targets != Vocabulary.pad_id).to(dtype)
    assert torch.equal(mask.sum(1).long(), LENGTHS)
    return annotations, inputs, targets, mask


def loss_of(output, targets, mask):
    return cross_entropy(output.logits, targets, mask) + doubly_stochastic(output.alphas, mask)


def test_the_default_decoder_takes_the_fused_path_and_others_do_not():
    assert make_decoder().fusable and fused.supports(make_decoder())
    assert not make_decoder(plain=True).fusable
    assert type(make_decoder().attention.score) is AdditiveScore


@pytest.mark.parametrize("plain", [False, True], ids=["fused", "stepwise"])
@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_teacher_forcing_matches_the_reference_logits_alphas_losses_and_gradients(gate, plain):
    decoder = make_decoder(3, gate=gate, plain=plain)
    annotations, inputs, targets, mask = make_batch()
    annotations.requires_grad_(True)  # the fused backward also returns d annotations
    params = [annotations, *decoder.parameters()]

    expected = reference.forward(decoder, annotations, inputs)
    expected_loss = loss_of(expected, targets, mask)
    expected_grads = torch.autograd.grad(expected_loss, params)
    output = decoder(annotations, inputs, lengths=LENGTHS)
    loss = loss_of(output, targets, mask)
    grads = torch.autograd.grad(loss, params)

    real = mask.bool()
    torch.testing.assert_close(output.logits[real], expected.logits[real], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(output.alphas[real], expected.alphas[real], rtol=1e-10, atol=1e-10)
    assert (output.logits[~real] == 0).all() and (output.alphas[~real] == 0).all()  # padding: not computed
    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=1e-12)
    names = ["annotations"] + [name for name, _ in decoder.named_parameters()]
    for name, got, want in zip(names, grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=name)


def test_with_grid_coordinates_the_fused_path_equals_the_stepwise_one():
    """model.extras.position=coordinates widens z_t to D + 2; the fused recurrence must follow it exactly."""
    grid = (3, 3)
    made = []
    for plain in (False, True):
        torch.manual_seed(5)
        attention = SoftAttention(AdditiveScore(annotation_dim=D + 2, hidden_dim=H, attention_dim=A),
                                  inputs=(GridCoordinates(grid=grid),))
        if plain:
            attention = PlainSoftAttention(attention.score, inputs=tuple(attention.inputs))
        made.append(AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=E, hidden_dim=H,
                                     attention=attention, dropout=0.0).to(torch.float64))
    assert made[0].fusable and not made[1].fusable
    annotations, inputs, targets, mask = make_batch(3)
    results = []
    for decoder in made:
        a = annotations.clone().requires_grad_(True)
        output = decoder(a, inputs, lengths=LENGTHS)
        loss = loss_of(output, targets, mask)
        results.append((output.logits, loss, torch.autograd.grad(loss, [a, *decoder.parameters()])))
    (logits, loss, grads), (want_logits, want_loss, want_grads) = results
    torch.testing.assert_close(logits, want_logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("plain", [False, True], ids=["fused", "stepwise"])
def test_without_lengths_every_step_is_computed_as_in_the_reference(plain):
    decoder = make_decoder(4, plain=plain)
    annotations, inputs, _, _ = make_batch(2)
    expected = reference.forward(decoder, annotations, inputs)
    output = decoder(annotations, inputs)
    torch.testing.assert_close(output.logits, expected.logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(output.alphas, expected.alphas, rtol=1e-10, atol=1e-10)


def test_float32_training_step_matches_the_reference_within_float_tolerance():
    # Dropout draws its masks over [B, T] in the reference and over the packed real positions here,
    # so the two are compared without it.
    decoder = make_decoder(5, dtype=torch.float32)
    annotations, inputs, targets, mask = make_batch(3, dtype=torch.float32)
    expected = reference.forward(decoder, annotations, inputs)
    expected_grads = torch.autograd.grad(loss_of(expected, targets, mask), list(decoder.parameters()))
    output = decoder(annotations, inputs, lengths=LENGTHS)
    grads = torch.autograd.grad(loss_of(output, targets, mask), list(decoder.parameters()))
    real = mask.bool()
    torch.testing.assert_close(output.logits[real], expected.logits[real], rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_fused_path_without_gradients_gives_the_same_outputs():
    decoder = make_decoder(6)
    annotations, inputs, _, mask = make_batch(4)
    with_grad = decoder(annotations, inputs, lengths=LENGTHS)
    with torch.no_grad():
        without = decoder(annotations, inputs, lengths=LENGTHS)
    # Without gradients nothing is kept and one scratch buffer serves every step: same numbers up to
    # the order of float64 roundings in the vectorized reductions.
    torch.testing.assert_close(without.logits, with_grad.logits.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(without.alphas, with_grad.alphas.detach(), rtol=1e-12, atol=1e-12)


def test_lengths_out_of_range_are_refused():
    decoder = make_decoder()
    annotations, inputs, _, _ = make_batch()
    with pytest.raises(ValueError, match="lengths"):
        decoder(annotations, inputs, lengths=torch.tensor([3, 7, 0, 5, 7]))
    with pytest.raises(ValueError, match="lengths"):
        decoder(annotations, inputs, lengths=torch.tensor([3, 8, 1, 5, 7]))


def test_state_dict_keys_and_shapes_are_unchanged():
    """Checkpoints of c47c7db load as they are: the fast paths read the same parameters."""
    state = make_decoder().state_dict()
    assert list(state) == [
        "attention.score.key.weight", "attention.score.key.bias", "attention.score.query.weight",
        "attention.score.v.weight", "embed.weight", "init_h.weight", "init_h.bias", "init_c.weight", "init_c.bias",
        "gate.weight", "gate.bias", "lstm.weight_ih", "lstm.weight_hh", "lstm.bias_ih", "lstm.bias_hh",
        "out_h.weight", "out_h.bias", "out_z.weight", "out.weight", "out.bias"]
    assert state["lstm.weight_ih"].shape == (4 * H, E + D)


def sharp_decoder(seed: int, *, plain: bool = False) -> AttentionDecoder:
    """float32 and a sharpened output layer, so that captions end at varied lengths (as in test_decoding)."""
    decoder = make_decoder(seed, plain=plain, dtype=torch.float32).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(3.0)
    return decoder


@pytest.mark.parametrize("plain", [False, True], ids=["grouped", "repeated"])
@pytest.mark.parametrize("beam_size", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(6))
def test_beam_search_returns_the_reference_beams(seed, beam_size, plain):
    decoder = sharp_decoder(seed, plain=plain)
    annotations = torch.randn(4, L, D, generator=torch.Generator().manual_seed(50 + seed))
    for penalty in (0.0, 0.7):
        expected = reference.beam_search(decoder, annotations, beam_size=beam_size, max_length=9,
                                         length_penalty=penalty)
        got = beam_search(decoder, annotations, beam_size=beam_size, max_length=9, length_penalty=penalty)
        assert torch.equal(got.tokens, expected.tokens)
        assert torch.equal(got.lengths, expected.lengths)
        torch.testing.assert_close(got.scores, expected.scores, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.alphas, expected.alphas, rtol=1e-5, atol=1e-6)


def test_some_reference_beams_end_early_and_some_run_to_the_limit():
    """Guards the test above: it must see both finished and unfinished hypotheses."""
    lengths = torch.cat([reference.beam_search(sharp_decoder(s), torch.randn(4, L, D, generator=torch.Generator()
                                                                          .manual_seed(50 + s)),
                                               beam_size=3, max_length=9).lengths for s in range(6)])
    assert (lengths < 9).any() and (lengths == 9).any()


@pytest.mark.parametrize("seed", range(3))
def test_min_length_runs_every_search_to_the_end_without_end_tokens(seed):
    decoder = sharp_decoder(seed)
    annotations = torch.randn(3, L, D, generator=torch.Generator().manual_seed(seed))
    got = beam_search(decoder, annotations, beam_size=3, max_length=12, min_length=12)
    expected = reference.beam_search(decoder, annotations, beam_size=3, max_length=12, min_length=12)
    assert got.tokens.shape == (3, 12)
    assert not (got.tokens == Vocabulary.end_id).any() and (got.lengths == 12).all()
    assert torch.equal(got.tokens, expected.tokens)
    torch.testing.assert_close(got.scores, expected.scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_grouped_step_equals_the_decoder_step_on_repeated_memory(seed):
    decoder = sharp_decoder(seed)
    annotations = torch.randn(3, L, D, generator=torch.Generator().manual_seed(seed))
    memory, state = decoder.prepare(annotations)
    rows = torch.arange(3).repeat_interleave(4)
    state = state.select(rows)
    state.h = state.h + 0.1 * torch.randn_like(state.h)  # hypotheses of one image that have diverged
    tokens = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(seed))
    step = fused.GroupedStep(decoder, keys=memory.keys, annotations=memory.annotations, group=4)
    logits, h, c, alpha = step(state.h, state.c, tokens)
    with torch.no_grad():
        want_logits, want_state, attended = decoder.step(memory.select(rows), state, tokens)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, want_state.h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, want_state.c, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alpha, attended.alpha, rtol=1e-5, atol=1e-6)


def test_greedy_equals_beam_size_one_of_the_reference():
    decoder = sharp_decoder(2)
    annotations = torch.randn(4, L, D, generator=torch.Generator().manual_seed(9))
    got = greedy(decoder, annotations, max_length=9)
    expected = reference.beam_search(decoder, annotations, beam_size=1, max_length=9)
    assert torch.equal(got.tokens, expected.tokens)
    torch.testing.assert_close(got.scores, expected.scores, rtol=1e-5, atol=1e-5)


def test_the_port_style_benchmark_computes_the_same_model():
    """benchmarks/port_style.py must differ from us in loop style only, or the speed comparison is unfair."""
    from benchmarks import port_style

    decoder = make_decoder(8, dtype=torch.float32).eval()
    annotations, inputs, _, mask = make_batch(5, dtype=torch.float32)
    expected = reference.forward(decoder, annotations, inputs)
    with torch.no_grad():
        got = port_style.forward(decoder, annotations, inputs, LENGTHS)
    real = mask.bool()
    torch.testing.assert_close(got.logits[real], expected.logits[real], rtol=1e-5, atol=1e-5)
    decoder = sharp_decoder(1)
    images = torch.randn(3, L, D, generator=torch.Generator().manual_seed(4))
    got = port_style.beam_search(decoder, images, beam_size=3, max_length=9, min_length=9)
    expected = reference.beam_search(decoder, images, beam_size=3, max_length=9, min_length=9)
    assert torch.equal(got.tokens, expected.tokens)
    torch.testing.assert_close(got.scores, expected.scores, rtol=1e-5, atol=1e-5)
