"""The fused path (captioning/model/fused.py) against the package's own step-by-step path, the
decoder's `_advance` (model.fused=false), on the same weights.

Same logits, alphas, losses and gradients for teacher forcing, with padding, mixed and unsorted
lengths, both gates and grid coordinates; same beams for beam search. What `_advance` itself
computes is held to the paper's equations in tests/model/test_decoder.py and test_decoding.py.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

from captioning.data.vocab import Vocabulary
from captioning.model import fused
from captioning.model.accelerator import accelerator_for
from captioning.model.decoding import beam_search
from captioning.model.extras.position import GridCoordinates
from captioning.model.paper import AdditiveScore, AttentionDecoder, SoftAttention, cross_entropy, doubly_stochastic

B, L, D, E, H, A, V, T = 5, 9, 8, 6, 16, 7, 11, 7
LENGTHS = torch.tensor([3, 7, 1, 5, 7])  # unsorted, with ties, a one-step row and full-length rows


def make_decoder(seed: int = 0, *, gate: str = "scalar", dtype=torch.float64, dropout: float = 0.0,
                 fused: bool = True) -> AttentionDecoder:
    torch.manual_seed(seed)
    attention = SoftAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=A))
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=E, hidden_dim=H, attention=attention,
                               gate=gate, dropout=dropout)
    decoder.accelerator = accelerator_for(decoder, enabled=fused)  # as build_decoder hands it out
    return decoder.to(dtype)


def stepwise(decoder: AttentionDecoder) -> AttentionDecoder:
    """The same weights on the step-by-step path."""
    twin = copy.deepcopy(decoder)
    twin.accelerator = None
    return twin


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


def outputs_and_gradients(decoder: AttentionDecoder, annotations, inputs, targets, mask, *, lengths=LENGTHS):
    annotations = annotations.clone().requires_grad_(True)  # the fused backward also returns d annotations
    output = decoder(annotations, inputs, lengths=lengths)
    loss = loss_of(output, targets, mask)
    return output, loss, torch.autograd.grad(loss, [annotations, *decoder.parameters()])


def test_the_default_and_the_switch_give_the_same_numbers_by_different_roundings():
    """Guards the comparisons below: the default decoder and its step-by-step twin (`stepwise`, and
    one built without an accelerator) must be two computations, or they would compare a path with itself.
    In float32 two arrangements of the same products agree to rounding, never bit for bit."""
    decoder = make_decoder(2, dtype=torch.float32)
    annotations, inputs, _, _ = make_batch(2, dtype=torch.float32)
    with torch.no_grad():
        default = decoder(annotations, inputs, lengths=LENGTHS)
        repeated = decoder(annotations, inputs, lengths=LENGTHS)
        for twin in (stepwise(decoder), make_decoder(2, dtype=torch.float32, fused=False)):
            other = twin(annotations, inputs, lengths=LENGTHS)
            torch.testing.assert_close(other.logits, default.logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(other.alphas, default.alphas, rtol=1e-5, atol=1e-6)
            assert not torch.equal(other.logits, default.logits)
    assert torch.equal(repeated.logits, default.logits)  # each path alone is deterministic


def build(overrides: list[str], seed: int = 7) -> AttentionDecoder:
    """A float64 decoder of the configuration's `model:` with these overrides, the same weights for a seed."""
    from captioning.config import load_config
    from captioning.model.encoder_decoder import build_decoder

    torch.manual_seed(seed)
    config = load_config(None, ["model.embed_dim=6", "model.hidden_dim=16", "model.attention_dim=7",
                                "model.dropout=0", *overrides])
    return build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=(3, 3)).to(torch.float64).eval()


@pytest.mark.parametrize("overrides", [
    ["model.extras.temperature=2.0"],  # the fused softmax has no temperature
    ["model.score=dot"],
    ["model.score=concat"],
    ["model.extras.query_word=true"],  # queried with [h_{t-1}; E y_{t-1}], not h_{t-1}
    ["model.attention=hard"],  # the expectation, outside training
])
def test_decoders_the_fused_path_does_not_implement_keep_their_own_equations(overrides):
    """With model.fused left on, a decoder the fused recurrence was not written for computes what it
    computes with the switch off (its `_advance`): the same logits, maps and gradients, for
    teacher forcing and for beam search."""
    decoder, switched = build(overrides), build([*overrides, "model.fused=false"])
    annotations, inputs, targets, mask = make_batch(6)
    output, loss, grads = outputs_and_gradients(decoder, annotations, inputs, targets, mask)
    want, want_loss, want_grads = outputs_and_gradients(switched, annotations, inputs, targets, mask)
    torch.testing.assert_close(output.logits, want.logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(output.alphas, want.alphas, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-12)
    for got, wanted in zip(grads, want_grads):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-12)
    images = annotations[:3]
    got = beam_search(decoder, images, beam_size=3, max_length=6)
    expected = beam_search(switched, images, beam_size=3, max_length=6)
    assert torch.equal(got.tokens, expected.tokens)
    torch.testing.assert_close(got.alphas, expected.alphas, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_teacher_forcing_equals_the_stepwise_logits_alphas_losses_and_gradients(gate):
    decoder = make_decoder(3, gate=gate)
    annotations, inputs, targets, mask = make_batch()
    output, loss, grads = outputs_and_gradients(decoder, annotations, inputs, targets, mask)
    expected, expected_loss, expected_grads = outputs_and_gradients(stepwise(decoder), annotations, inputs,
                                                                    targets, mask)
    real = mask.bool()
    torch.testing.assert_close(output.logits[real], expected.logits[real], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(output.alphas[real], expected.alphas[real], rtol=1e-10, atol=1e-10)
    assert (output.logits[~real] == 0).all() and (output.alphas[~real] == 0).all()  # padding: not computed
    torch.testing.assert_close(loss, expected_loss, rtol=1e-12, atol=1e-12)
    names = ["annotations"] + [name for name, _ in decoder.named_parameters()]
    for name, got, want in zip(names, grads, expected_grads):
        assert got.abs().sum() > 0, name  # every gradient is there to compare
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=name)


def test_with_grid_coordinates_the_fused_path_equals_the_stepwise_one():
    """model.extras.position=coordinates widens z_t to D + 2; the fused recurrence must follow it exactly."""
    torch.manual_seed(5)
    attention = SoftAttention(AdditiveScore(annotation_dim=D + 2, hidden_dim=H, attention_dim=A),
                              inputs=(GridCoordinates(grid=(3, 3)),))
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=E, hidden_dim=H, attention=attention,
                               dropout=0.0).to(torch.float64)
    decoder.accelerator = accelerator_for(decoder)
    annotations, inputs, targets, mask = make_batch(3)
    (output, loss, grads), (want, want_loss, want_grads) = (
        outputs_and_gradients(d, annotations, inputs, targets, mask) for d in (decoder, stepwise(decoder)))
    torch.testing.assert_close(output.logits, want.logits, rtol=1e-10, atol=1e-10)
    assert not torch.equal(output.logits, want.logits)  # two computations (as the guard above)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-12)
    for got, wanted in zip(grads, want_grads):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-12)


def test_without_lengths_every_step_is_computed_as_on_the_stepwise_path():
    decoder = make_decoder(4)
    annotations, inputs, _, _ = make_batch(2)
    output = decoder(annotations, inputs)
    expected = stepwise(decoder)(annotations, inputs)
    assert (output.alphas.sum(-1) - 1).abs().max() < 1e-12  # padding steps too: every row, every step
    torch.testing.assert_close(output.logits, expected.logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(output.alphas, expected.alphas, rtol=1e-10, atol=1e-10)


def test_float32_training_step_equals_the_stepwise_one_within_float_tolerance():
    decoder = make_decoder(5, dtype=torch.float32)
    annotations, inputs, targets, mask = make_batch(3, dtype=torch.float32)
    output, _, grads = outputs_and_gradients(decoder, annotations, inputs, targets, mask)
    expected, _, expected_grads = outputs_and_gradients(stepwise(decoder), annotations, inputs, targets, mask)
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


def sharp_decoder(seed: int) -> AttentionDecoder:
    """float32 and a sharpened output layer, so that captions end at varied lengths (as in test_decoding)."""
    decoder = make_decoder(seed, dtype=torch.float32).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(3.0)
    return decoder


@pytest.mark.parametrize("beam_size", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(6))
def test_beam_search_returns_the_stepwise_beams(seed, beam_size):
    """Grouped (each image's memory shared by its beams, fused.GroupedStep) against the decoder's
    `step` on memory repeated per beam."""
    decoder = sharp_decoder(seed)
    annotations = torch.randn(4, L, D, generator=torch.Generator().manual_seed(50 + seed))
    for penalty in (0.0, 0.7):
        expected = beam_search(stepwise(decoder), annotations, beam_size=beam_size, max_length=9,
                               length_penalty=penalty)
        got = beam_search(decoder, annotations, beam_size=beam_size, max_length=9, length_penalty=penalty)
        assert torch.equal(got.tokens, expected.tokens)
        assert torch.equal(got.lengths, expected.lengths)
        torch.testing.assert_close(got.scores, expected.scores, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.alphas, expected.alphas, rtol=1e-5, atol=1e-6)


def test_some_beams_end_early_and_some_run_to_the_limit():
    """Guards the test above: it must see both finished and unfinished hypotheses."""
    lengths = torch.cat([beam_search(sharp_decoder(s), torch.randn(4, L, D, generator=torch.Generator()
                                                                    .manual_seed(50 + s)),
                                     beam_size=3, max_length=9).lengths for s in range(6)])
    assert (lengths < 9).any() and (lengths == 9).any()


@pytest.mark.parametrize("seed", range(3))
def test_min_length_runs_every_search_to_the_end_without_end_tokens(seed):
    decoder = sharp_decoder(seed)
    annotations = torch.randn(3, L, D, generator=torch.Generator().manual_seed(seed))
    got = beam_search(decoder, annotations, beam_size=3, max_length=12, min_length=12)
    expected = beam_search(stepwise(decoder), annotations, beam_size=3, max_length=12, min_length=12)
    assert got.tokens.shape == (3, 12)
    assert not (got.tokens == Vocabulary.end_id).any() and (got.lengths == 12).all()
    assert torch.equal(got.tokens, expected.tokens)
    torch.testing.assert_close(got.scores, expected.scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_grouped_step_equals_the_decoder_step_on_repeated_memory(seed):
    decoder = sharp_decoder(seed)
    annotations = torch.randn(3, L, D, generator=torch.Generator().manual_seed(seed))
    memory, state = decoder.start(annotations)
    rows = torch.arange(3).repeat_interleave(4)
    state = state.select(rows)
    state.h = state.h + 0.1 * torch.randn_like(state.h)  # hypotheses of one image that have diverged
    tokens = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(seed))
    step = fused.GroupedStep(decoder, keys=memory.keys, annotations=memory.annotations, group=4)
    logits, h, c, alpha = step(state.h, state.c, tokens)
    with torch.no_grad():
        want_logits, want_state, attended = decoder.next_word(memory.select(rows), state, tokens)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, want_state.h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, want_state.c, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alpha, attended.alpha, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["port_style", "reference"])
def test_the_benchmarks_other_implementations_compute_the_same_model(name):
    """benchmarks/run.py times `port` (the popular ports' loop style) and `reference` (the loop before
    the fused path) against the package: they must differ in loop style only, or the speed comparison
    is unfair."""
    implementation = importlib.import_module(f"benchmarks.implementations.{name}")
    decoder = make_decoder(8, dtype=torch.float32).eval()
    annotations, inputs, _, mask = make_batch(5, dtype=torch.float32)
    with torch.no_grad():
        expected = stepwise(decoder)(annotations, inputs, lengths=LENGTHS)
        got = (implementation.forward(decoder, annotations, inputs, LENGTHS) if name == "port_style"
               else implementation.forward(decoder, annotations, inputs))
    real = mask.bool()
    torch.testing.assert_close(got.logits[real], expected.logits[real], rtol=1e-5, atol=1e-5)
    decoder = sharp_decoder(1)
    images = torch.randn(3, L, D, generator=torch.Generator().manual_seed(4))
    got = implementation.beam_search(decoder, images, beam_size=3, max_length=9, min_length=9)
    expected = beam_search(stepwise(decoder), images, beam_size=3, max_length=9, min_length=9)
    assert torch.equal(got.tokens, expected.tokens)
    torch.testing.assert_close(got.scores, expected.scores, rtol=1e-5, atol=1e-5)


def test_model_fused_false_reaches_the_decoder_and_leaves_the_records_model_digest_alone():
    """The switch a researcher sets (`model.fused=false`) computes the paper's decoder step by step: the
    same numbers to float rounding, not the same bits (the default's fused path arranges the products
    otherwise). It changes how the numbers are computed, not what they are, so a checkpoint's record
    does not call it a different model."""
    from captioning.config import load_config
    from captioning.train.provenance import model_settings

    decoder, switched = build([]).float(), build(["model.fused=false"]).float()
    annotations, inputs, _, _ = make_batch(4, dtype=torch.float32)
    with torch.no_grad():
        got, want = decoder(annotations, inputs, lengths=LENGTHS), switched(annotations, inputs, lengths=LENGTHS)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got.logits, want.logits)
    default = load_config(None, [])
    assert model_settings(default) == model_settings(load_config(None, ["model.fused=false"]))
    assert model_settings(default) != model_settings(load_config(None, ["model.gate=vector"]))


def test_the_builder_chooses_the_accelerator_and_the_decoder_imports_none():
    """build_decoder hands the fused path to the decoders it computes and to no other; the decoder
    module imports neither the fused path nor its check (it only asks whether it holds one)."""
    import ast

    from captioning.model.accelerator import FusedPath
    from tests.tiny import REPO

    assert isinstance(build([]).accelerator, FusedPath)
    for overrides in (["model.fused=false"], ["model.attention=hard"], ["model.score=dot"],
                      ["model.extras.query_word=true"]):
        assert build(overrides).accelerator is None, overrides
    for module in ("paper", "packing"):  # the paper's decoder, and the teacher forcing that runs it
        tree = ast.parse((REPO / f"captioning/model/{module}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                     for alias in node.names}
        assert not {name for name in imported if "fused" in name or "accelerator" in name}, (module, imported)


def test_a_decoder_whose_score_was_swapped_after_it_was_built_stops_rather_than_run_the_old_path():
    from captioning.model.fused_check import FastPathError
    from captioning.model.scores import DotScore

    decoder = build([])
    decoder.attention.score = DotScore(annotation_dim=D, hidden_dim=16, attention_dim=7).to(torch.float64)
    annotations, inputs, _, _ = make_batch(3)
    with pytest.raises(FastPathError, match="no longer soft attention with the additive score"):
        decoder(annotations, inputs, lengths=LENGTHS)
    decoder.accelerator = None  # the way out it names
    decoder(annotations, inputs, lengths=LENGTHS)
