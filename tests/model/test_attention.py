"""Soft attention with the additive score (Eqs. 4-6, 13): weights, score, context, gradients, Memory."""

from __future__ import annotations

import pytest
import torch

from captioning.config import ConfigError
from captioning.model import fused_check
from captioning.model.encoder_decoder import build_attention
from captioning.model.paper import AdditiveScore, AttentionDecoder, AttentionOutput, Memory, SoftAttention
from tests.model.sizes import A, B, D, H, L, V, inputs, model_section


def make_attention(seed: int = 0, dtype=torch.float32) -> SoftAttention:
    torch.manual_seed(seed)
    return build_attention(model_section(), annotation_dim=D, query_dim=H, grid=None).to(dtype)


def test_the_papers_model_section_gives_soft_attention_with_the_additive_score():
    attention = make_attention()
    assert isinstance(attention, SoftAttention)
    assert isinstance(attention.score, AdditiveScore)
    assert attention.score.key.weight.shape == (A, D)
    assert attention.score.query.weight.shape == (A, H)
    assert attention.score.v.weight.shape == (1, A)


@pytest.mark.parametrize("kind, score", [("hardest", "additive"), ("soft", "telepathic")])
def test_unknown_attention_names_are_refused_with_the_choices(kind, score):
    with pytest.raises(ConfigError, match=f"'{kind if kind != 'soft' else score}' is not one of"):
        model_section(f"attention={kind}", f"score={score}")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alphas_are_a_distribution_over_cells(seed):
    attention = make_attention(seed)
    annotations, hidden = inputs(seed + 10)
    with torch.no_grad():
        out = attention(attention.start(annotations), hidden * 5)  # large inputs: saturated tanh
    assert isinstance(out, AttentionOutput)
    assert out.alpha.shape == (B, L)
    assert out.context.shape == (B, D)
    assert (out.alpha >= 0).all()
    torch.testing.assert_close(out.alpha.sum(1), torch.ones(B))
    assert out.log_prob is None and out.entropy is None  # soft attention samples nothing


def test_additive_score_matches_the_formula_from_the_weights():
    attention = make_attention()
    annotations, hidden = inputs()
    score = attention.score
    W_a, b_a = score.key.weight, score.key.bias  # [A, D], [A]
    W_h, v = score.query.weight, score.v.weight[0]  # [A, H], [A]
    expected = torch.empty(B, L)
    for b in range(B):
        for i in range(L):
            expected[b, i] = v @ torch.tanh(W_a @ annotations[b, i] + b_a + W_h @ hidden[b])
    with torch.no_grad():
        got = score(score.keys(annotations), hidden)  # [B, L]
        out = attention(attention.start(annotations), hidden)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.alpha, torch.softmax(expected, dim=1), rtol=1e-5, atol=1e-6)


def test_context_is_the_alpha_weighted_sum_of_annotations():
    attention = make_attention()
    annotations, hidden = inputs()
    with torch.no_grad():
        out = attention(attention.start(annotations), hidden)
    expected = torch.stack([sum(out.alpha[b, i] * annotations[b, i] for i in range(L)) for b in range(B)])
    torch.testing.assert_close(out.context, expected, rtol=1e-5, atol=1e-6)


def test_permuting_cells_permutes_alphas_and_keeps_the_context():
    attention = make_attention()
    annotations, hidden = inputs()
    perm = torch.randperm(L, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = attention(attention.start(annotations), hidden)
        shuffled = attention(attention.start(annotations[:, perm]), hidden)
    torch.testing.assert_close(shuffled.alpha, out.alpha[:, perm])
    torch.testing.assert_close(shuffled.context, out.context)


def test_rows_of_the_batch_are_independent():
    attention = make_attention()
    annotations, hidden = inputs()
    with torch.no_grad():
        both = attention(attention.start(annotations), hidden)
        second = attention(attention.start(annotations[1:]), hidden[1:])
    torch.testing.assert_close(both.alpha[1:], second.alpha)
    torch.testing.assert_close(both.context[1:], second.context)


def test_prepare_holds_the_annotations_and_their_key_projection():
    attention = make_attention()
    annotations, _ = inputs()
    with torch.no_grad():
        memory = attention.start(annotations)
    assert memory.annotations is annotations
    assert memory.keys.shape == (B, L, A)
    torch.testing.assert_close(memory.keys, annotations @ attention.score.key.weight.T + attention.score.key.bias)


def test_gradcheck_float64_wrt_annotations_and_hidden():
    attention = make_attention(dtype=torch.float64)
    annotations, hidden = inputs(dtype=torch.float64)
    annotations.requires_grad_(True)
    hidden.requires_grad_(True)

    def run(a, h):
        out = attention(attention.start(a), h)
        return out.context, out.alpha

    assert torch.autograd.gradcheck(run, (annotations, hidden), eps=1e-6, atol=1e-5)


def test_gradients_reach_every_attention_parameter():
    attention = make_attention()
    annotations, hidden = inputs()
    out = attention(attention.start(annotations), hidden)
    (out.context ** 2).sum().backward()
    for name, parameter in attention.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_memory_select_picks_rows_of_both_tensors():
    annotations = torch.arange(3 * 2 * 1, dtype=torch.float32).view(3, 2, 1)
    keys = -annotations.repeat(1, 1, 2)  # [3, 2, 2]
    memory = Memory(annotations=annotations, keys=keys)
    index = torch.tensor([2, 0, 0, 1])
    picked = memory.select(index)
    assert isinstance(picked, Memory)
    torch.testing.assert_close(picked.annotations, annotations[index])
    torch.testing.assert_close(picked.keys, keys[index])
    torch.testing.assert_close(memory.annotations, torch.arange(6, dtype=torch.float32).view(3, 2, 1))  # untouched


def test_attention_on_selected_memory_equals_attention_on_the_original_rows():
    attention = make_attention()
    annotations, hidden = inputs()
    index = torch.tensor([1, 1, 0])
    with torch.no_grad():
        memory = attention.start(annotations)
        selected = attention(memory.select(index), hidden[index])
        direct = attention(attention.start(annotations[index]), hidden[index])
    torch.testing.assert_close(selected.alpha, direct.alpha)
    torch.testing.assert_close(selected.context, direct.context)


def test_image_side_projection_runs_once_per_image_during_a_decoder_forward():
    attention = make_attention()
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                               dropout=0.0).eval()
    # The count is the behaviour: re-projecting per step gives the same numbers at T times the cost, and
    # teacher forcing has no rows per image (as beams are) to show it in a count of operations.
    fused_check.prove_recurrence(decoder, torch.zeros(1, L, D))  # the fast path's one-time check, not counted
    calls = []
    handle = attention.score.key.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
    steps = 6
    try:
        annotations, _ = inputs()
        tokens = torch.randint(0, V, (B, steps), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            output = decoder(annotations, tokens)
    finally:
        handle.remove()
    assert output.alphas.shape == (B, steps, L)
    assert calls == [torch.Size([B, L, D])]  # once, on the whole batch, not once per step
