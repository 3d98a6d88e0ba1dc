"""The attention LSTM decoder (Sec. 3.1.2): shapes, teacher forcing vs stepping, gate, initial state."""

from __future__ import annotations

import functools

import pytest
import torch

from captioning.data.vocab import Vocabulary
from captioning.model.extras.layout import LayoutSummary
from captioning.model.paper import AdditiveScore, AttentionDecoder, DecoderOutput, SoftAttention
from captioning.model.state import DecoderState

B, L, D, E, H, A, V, T = 2, 9, 8, 8, 16, 8, 11, 6


def make_decoder(seed: int = 0, *, gate: str = "scalar", dropout: float = 0.0,
                 deep_output: str = "linear") -> AttentionDecoder:
    torch.manual_seed(seed)
    attention = SoftAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=A))
    return AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=E, hidden_dim=H, attention=attention,
                            gate=gate, dropout=dropout, deep_output=deep_output)


def make_inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    annotations = torch.randn(B, L, D, generator=generator)
    tokens = torch.randint(4, V, (B, T), generator=generator)
    tokens[:, 0] = Vocabulary.start_id
    return annotations, tokens


@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_forward_shapes(gate):
    decoder = make_decoder(gate=gate).eval()
    annotations, tokens = make_inputs()
    with torch.no_grad():
        output = decoder(annotations, tokens)
    assert isinstance(output, DecoderOutput)
    assert output.logits.shape == (B, T, V)
    assert output.alphas.shape == (B, T, L)
    assert output.log_probs is None and output.entropies is None  # soft attention
    assert (output.alphas >= 0).all()
    torch.testing.assert_close(output.alphas.sum(2), torch.ones(B, T))
    assert torch.isfinite(output.logits).all()


@pytest.mark.parametrize("gate", ["scalar", "vector"])
@pytest.mark.parametrize("seed", [0, 1])
def test_teacher_forcing_equals_step_by_step_decoding(gate, seed):
    decoder = make_decoder(seed, gate=gate, dropout=0.5).eval()  # eval: dropout is off
    annotations, tokens = make_inputs(seed + 5)
    with torch.no_grad():
        output = decoder(annotations, tokens)
        memory, state = decoder.start(annotations)
        logits, alphas = [], []
        for t in range(T):
            step_logits, state, attended = decoder.next_word(memory, state, tokens[:, t])
            logits.append(step_logits)
            alphas.append(attended.alpha)
    torch.testing.assert_close(output.logits, torch.stack(logits, 1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(output.alphas, torch.stack(alphas, 1), rtol=1e-6, atol=1e-6)


def test_dropout_is_active_in_training_and_off_in_eval():
    decoder = make_decoder(dropout=0.5)
    annotations, tokens = make_inputs()
    decoder.train()
    torch.manual_seed(0)
    first = decoder(annotations, tokens).logits
    second = decoder(annotations, tokens).logits
    assert not torch.allclose(first, second)
    decoder.eval()
    torch.testing.assert_close(decoder(annotations, tokens).logits, decoder(annotations, tokens).logits)


def test_gate_has_one_output_for_scalar_and_D_for_vector():
    assert make_decoder(gate="scalar").gate.out_features == 1
    assert make_decoder(gate="vector").gate.out_features == D
    assert make_decoder(gate="scalar").gate.in_features == H


@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_lstm_input_is_the_word_embedding_and_the_gated_context(gate):
    """LSTM input [E y_{t-1}; beta_t * z_t] with beta_t = sigmoid(f_beta(h_{t-1})) (Sec. 4.2.1): the
    step's new (h_t, c_t) are the LSTM's on that input, and the word's logits (Eq. 7) follow from them,
    step by step and teacher-forced (the fused path) alike."""
    decoder = make_decoder(3, gate=gate).eval()
    annotations, tokens = make_inputs()
    with torch.no_grad():
        memory, state = decoder.start(annotations)
        attended = decoder.attention(memory, state.h)
        beta = torch.sigmoid(decoder.gate(state.h))  # [B, 1] or [B, D]
        embedded, z = decoder.embed(tokens[:, 0]), beta * attended.context
        h, c = decoder.lstm(torch.cat([embedded, z], 1), (state.h, state.c))
        expected = decoder.out(embedded + decoder.out_h(h) + decoder.out_z(z))
        logits, new_state, _ = decoder.next_word(memory, state, tokens[:, 0])
        teacher_forced = decoder(annotations, tokens[:, :1]).logits[:, 0]
    torch.testing.assert_close(new_state.h, h)
    torch.testing.assert_close(new_state.c, c)
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(teacher_forced, expected)
    assert beta.shape == ((B, 1) if gate == "scalar" else (B, D))
    assert not torch.allclose(beta, torch.ones_like(beta), atol=1e-2)  # a gate that changes the input


@pytest.mark.parametrize("deep_output", ["linear", "tanh"])
def test_deep_output_layer_eq7(deep_output):
    """p(y_t) ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t)) as printed; the authors' code has a tanh
    before L_o."""
    decoder = make_decoder(4, deep_output=deep_output).eval()
    annotations, tokens = make_inputs()
    with torch.no_grad():
        memory, state = decoder.start(annotations)
        attended = decoder.attention(memory, state.h)
        z = torch.sigmoid(decoder.gate(state.h)) * attended.context
        embedded = decoder.embed(tokens[:, 0])
        h, _ = decoder.lstm(torch.cat([embedded, z], 1), (state.h, state.c))
        hidden = embedded + decoder.out_h(h) + decoder.out_z(z)
        expected = decoder.out(torch.tanh(hidden) if deep_output == "tanh" else hidden)
        logits, new_state, _ = decoder.next_word(memory, state, tokens[:, 0])
        teacher_forced = decoder(annotations, tokens[:, :1]).logits[:, 0]  # the packed path, fused here
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(teacher_forced, expected)
    torch.testing.assert_close(new_state.h, h)


def test_initial_state_comes_from_the_mean_annotation():
    decoder = make_decoder()
    annotations, _ = make_inputs()
    with torch.no_grad():
        _, state = decoder.start(annotations)
        mean = annotations.mean(1)
        assert isinstance(state, DecoderState)
        assert state.h.shape == state.c.shape == (B, H)
        torch.testing.assert_close(state.h, torch.tanh(decoder.init_h(mean)))
        torch.testing.assert_close(state.c, decoder.init_c(mean))
        # different annotations with the same mean give the same initial state
        other = annotations + torch.randn(B, L, D, generator=torch.Generator().manual_seed(9))
        other = other - other.mean(1, keepdim=True) + mean[:, None]
        _, same = decoder.start(other)
    torch.testing.assert_close(same.h, state.h)
    torch.testing.assert_close(same.c, state.c)


def test_layout_init_adds_every_cell_in_grid_order_to_the_mean():
    torch.manual_seed(3)
    attention = SoftAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=A))
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=E, hidden_dim=H, attention=attention,
                               summary=functools.partial(LayoutSummary, cells=L, layout_dim=3))
    annotations, tokens = make_inputs()
    perm = torch.randperm(L, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, state = decoder.start(annotations)
        layout = decoder.summary.layout(annotations).reshape(B, L * 3)
        summary = torch.cat([annotations.mean(1), layout], 1)  # [B, D + 3L]
        _, shuffled = decoder.start(annotations[:, perm])
    assert decoder.init_h.in_features == decoder.init_c.in_features == D + L * 3
    torch.testing.assert_close(state.h, torch.tanh(decoder.init_h(summary)))
    torch.testing.assert_close(state.c, decoder.init_c(summary))
    assert (shuffled.h - state.h).abs().max() > 1e-3  # unlike the mean, it knows where things are
    assert decoder(annotations, tokens).logits.shape == (B, T, V)


def test_layout_init_needs_the_grid():
    from captioning.config import load_config
    from captioning.model.encoder_decoder import build_decoder

    model = load_config(None, ["model.extras.init=layout"]).model
    assert build_decoder(model, vocab_size=V, annotation_dim=D, grid=(3, 3)).init_h.in_features == D + 9 * 8
    with pytest.raises(ValueError, match="grid"):
        build_decoder(model, vocab_size=V, annotation_dim=D, grid=None)


def test_permuting_cells_keeps_the_state_and_outputs_and_permutes_the_maps():
    decoder = make_decoder(2).eval()
    annotations, tokens = make_inputs()
    perm = torch.randperm(L, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, state = decoder.start(annotations)
        _, shuffled_state = decoder.start(annotations[:, perm])
        output = decoder(annotations, tokens)
        shuffled = decoder(annotations[:, perm], tokens)
    torch.testing.assert_close(shuffled_state.h, state.h)
    torch.testing.assert_close(shuffled_state.c, state.c)
    torch.testing.assert_close(shuffled.logits[:, 0], output.logits[:, 0])  # the first step
    torch.testing.assert_close(shuffled.logits, output.logits)  # and, with the additive score, all steps
    torch.testing.assert_close(shuffled.alphas, output.alphas[:, :, perm])


def test_outputs_are_causal_in_the_input_tokens():
    decoder = make_decoder().eval()
    annotations, tokens = make_inputs()
    changed = tokens.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % V
    with torch.no_grad():
        output = decoder(annotations, tokens)
        other = decoder(annotations, changed)
    torch.testing.assert_close(other.logits[:, :3], output.logits[:, :3])
    torch.testing.assert_close(other.alphas[:, :4], output.alphas[:, :4])  # alpha_t uses h_{t-1}
    assert not torch.allclose(other.logits[:, 3:], output.logits[:, 3:])


def test_batch_rows_are_independent():
    decoder = make_decoder().eval()
    annotations, tokens = make_inputs()
    with torch.no_grad():
        both = decoder(annotations, tokens)
        alone = decoder(annotations[1:], tokens[1:])
    torch.testing.assert_close(both.logits[1:], alone.logits)
    torch.testing.assert_close(both.alphas[1:], alone.alphas)


@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_gradients_reach_every_parameter(gate):
    decoder = make_decoder(gate=gate)
    annotations, tokens = make_inputs()
    output = decoder(annotations, tokens)
    (output.logits.logsumexp(2).sum() - output.logits[..., 5].sum() + output.alphas[..., 0].sum()).backward()
    for name, parameter in decoder.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name


def test_decoder_state_select_picks_rows():
    state = DecoderState(h=torch.arange(6.0).view(3, 2), c=-torch.arange(6.0).view(3, 2))
    picked = state.select(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(picked.h, torch.tensor([[4.0, 5.0], [4.0, 5.0], [0.0, 1.0]]))
    torch.testing.assert_close(picked.c, -picked.h)


@pytest.mark.parametrize("overrides", [(), ("score=dot",), ("attention=hard",)])
def test_a_one_word_prefix_gives_the_first_step_of_a_longer_one(overrides):
    """A caption of one step (teacher forcing on <start> alone) through the fused recurrence (additive),
    the stepwise one (dot) and hard attention: the first step of the same forward over T steps."""
    from tests.model.sizes import make_attention

    torch.manual_seed(0)
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=E, hidden_dim=H,
                               attention=make_attention(*overrides), dropout=0.0).eval()
    annotations, tokens = make_inputs()
    with torch.no_grad():
        one, whole = decoder(annotations, tokens[:, :1]), decoder(annotations, tokens)
    assert one.logits.shape == (B, 1, V)
    torch.testing.assert_close(one.logits, whole.logits[:, :1])
    torch.testing.assert_close(one.alphas, whole.alphas[:, :1])
    assert (one.locations is None) == (whole.locations is None) == ("attention=hard" not in overrides)
