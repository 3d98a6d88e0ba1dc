"""A second glimpse per word (model.extras.glimpses=2): its query, its context, and every path that runs it."""

from __future__ import annotations

import pytest
import torch

from captioning.config import ConfigError, load_config
from captioning.data.vocab import Vocabulary
from captioning.model.accelerator import accelerator_for
from captioning.model.decoding import beam_search, greedy
from captioning.model.encoder_decoder import build_attention, build_decoder
from captioning.model.extras.glimpses import TwoGlimpses
from captioning.model.paper import AttentionDecoder, Memory

B, GRID, D, E, H, A, V, T = 3, (3, 4), 8, 8, 16, 8, 11, 7
L = GRID[0] * GRID[1]


def make_decoder(seed: int = 0, *, score: str = "additive", position: str = "none") -> AttentionDecoder:
    torch.manual_seed(seed)
    model = load_config(None, [f"model.score={score}", f"model.attention_dim={A}",
                               f"model.extras.position={position}"]).model
    first = build_attention(model, annotation_dim=D, query_dim=H, grid=GRID)
    second = build_attention(model, annotation_dim=D, query_dim=H + first.context_dim(D), grid=GRID)
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=E, hidden_dim=H,
                               attention=TwoGlimpses(first, second), dropout=0.0).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(3.0)  # captions that end at varied lengths
    return decoder


def make_inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    annotations = torch.randn(B, L, D, generator=generator)
    tokens = torch.randint(4, V, (B, T), generator=generator)
    tokens[:, 0] = Vocabulary.start_id
    return annotations, tokens


def test_second_glimpse_is_queried_with_the_state_and_the_first_context():
    """z_t = [z_t; z'_t], z'_t = sum_i alpha'_ti a_i, alpha'_t = softmax(v'^T tanh(W'_a a_i + W'_h [h; z_t]))."""
    decoder = make_decoder(3)
    annotations, tokens = make_inputs()
    seen = []
    handle = decoder.lstm.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            memory, state = decoder.start(annotations)
            first = decoder.attention.first(memory.first, state.h).context  # [B, D]
            score = decoder.attention.second.score
            e = score.v(torch.tanh(score.key(annotations) + score.query(torch.cat([state.h, first], 1))[:, None]))
            second = torch.einsum("bl,bld->bd", torch.softmax(e.squeeze(2), dim=1), annotations)  # [B, D]
            beta = torch.sigmoid(decoder.gate(state.h))  # [B, 1]
            decoder.next_word(memory, state, tokens[:, 0])
    finally:
        handle.remove()
    assert decoder.lstm.input_size == E + 2 * D and decoder.out_z.in_features == 2 * D
    torch.testing.assert_close(seen[0][:, E:], beta * torch.cat([first, second], 1))
    assert (second - first).abs().max() > 1e-3  # its own parameters: not a copy of the first glimpse


@pytest.mark.parametrize("score,position", [("additive", "none"), ("local", "coordinates"), ("dot", "learned")])
def test_teacher_forcing_with_ragged_lengths_equals_step_by_step(score, position):
    decoder = make_decoder(1, score=score, position=position)
    annotations, tokens = make_inputs(2)
    lengths = torch.tensor([4, T, 2])  # unsorted, so the packed path sorts and shrinks the batch
    assert accelerator_for(decoder) is None  # the fused recurrence knows one glimpse only
    assert_teacher_forcing_equals_stepping(decoder, annotations, tokens, lengths)


def assert_teacher_forcing_equals_stepping(decoder: AttentionDecoder, annotations: torch.Tensor,
                                           tokens: torch.Tensor, lengths: torch.Tensor) -> None:
    """The packed teacher-forced pass gives each running row the logits and maps of `step`, and zeros past its end."""
    with torch.no_grad():
        output = decoder(annotations, tokens, lengths=lengths)
        memory, state = decoder.start(annotations)
        for t in range(tokens.shape[1]):
            logits, state, attended = decoder.next_word(memory, state, tokens[:, t])
            running = lengths > t
            torch.testing.assert_close(output.logits[running, t], logits[running], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(output.alphas[running, t], attended.alpha[running], rtol=1e-5, atol=1e-6)
            assert (output.logits[~running, t] == 0).all()


def test_memory_rows_carry_both_glimpses_memories():
    decoder = make_decoder()
    annotations, _ = make_inputs()
    memory, _ = decoder.start(annotations)
    assert isinstance(memory.first, Memory) and isinstance(memory.second, Memory)
    index = torch.tensor([2, 2, 0])
    picked, first_two = memory.select(index), memory.prefix(2)
    for name in ("first", "second"):
        whole, rows, prefix = (getattr(m, name) for m in (memory, picked, first_two))
        torch.testing.assert_close(rows.keys, whole.keys[index])
        torch.testing.assert_close(prefix.keys, whole.keys[:2])
        assert prefix.keys.data_ptr() == whole.keys.data_ptr()  # a view, never a copy


@pytest.mark.parametrize("beam_size", [1, 3])
def test_searches_score_the_caption_they_return(beam_size):
    """Beam search repeats the memory per hypothesis: the second glimpse's memory must follow."""
    decoder = make_decoder(4)
    annotations, _ = make_inputs(5)
    captions = beam_search(decoder, annotations, beam_size=beam_size, max_length=6)
    if beam_size == 1:
        assert torch.equal(captions.tokens, greedy(decoder, annotations, max_length=6).tokens)
    assert_search_scores_its_captions(decoder, annotations, captions)


def assert_search_scores_its_captions(decoder: AttentionDecoder, annotations: torch.Tensor, captions) -> None:
    """A search's scores and maps are those of teacher forcing on the captions it returns."""
    tokens = captions.tokens
    inputs = torch.cat([torch.full_like(tokens[:, :1], Vocabulary.start_id), tokens[:, :-1]], dim=1)
    with torch.no_grad():
        output = decoder(annotations, inputs)
    log_probs = torch.log_softmax(output.logits, 2).gather(2, tokens[..., None])[..., 0]  # [B, T]
    counted = torch.arange(tokens.shape[1])[None] <= captions.lengths[:, None]
    torch.testing.assert_close(captions.scores, (log_probs * counted).sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(captions.alphas, output.alphas, rtol=1e-5, atol=1e-6)  # the reported maps


def test_the_reported_map_is_the_mean_of_both_glimpses_maps():
    """Teacher forcing and greedy decoding report (alpha_t + alpha'_t) / 2, a distribution, not the
    first glimpse's alpha_t alone: which glimpse looks at the named object varies with the seed. (Beam
    search reports teacher forcing's maps: test_searches_score_the_caption_they_return.)"""
    decoder = make_decoder(7)
    annotations, tokens = make_inputs(8)
    maps: dict[str, list[torch.Tensor]] = {"first": [], "second": []}
    hooks = [module.register_forward_hook(lambda module, inputs, output, name=name: maps[name].append(output.alpha))
             for name, module in (("first", decoder.attention.first), ("second", decoder.attention.second))]
    try:
        with torch.no_grad():
            output = decoder(annotations, tokens)  # the stepwise path: one call of each glimpse per step
            first, second = (torch.stack(maps[name], 1) for name in ("first", "second"))  # [B, T, L]
            for name in maps:
                maps[name].clear()
            captions = greedy(decoder, annotations, max_length=6)
            searched = [torch.stack(maps[name], 1) for name in ("first", "second")]
    finally:
        for hook in hooks:
            hook.remove()
    assert (first - second).abs().max() > 1e-2  # two different maps, so the mean is not either one
    torch.testing.assert_close(output.alphas, (first + second) / 2)
    torch.testing.assert_close(output.alphas.sum(2), torch.ones(B, T))
    steps = captions.alphas.shape[1]
    torch.testing.assert_close(captions.alphas, (searched[0][:, :steps] + searched[1][:, :steps]) / 2)


def test_gradients_reach_both_glimpses_in_float64():
    decoder = make_decoder(6, score="local", position="coordinates").double().train()
    annotations, tokens = make_inputs()
    annotations = annotations.double().requires_grad_()
    output = decoder(annotations, tokens)
    (output.logits.logsumexp(2).sum() - output.logits[..., 5].sum()).backward()
    named = dict(decoder.named_parameters())
    assert any(name.startswith("attention.second.") for name in named)
    for name, parameter in named.items():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name

    def logits_of(a: torch.Tensor) -> torch.Tensor:
        return decoder(a, tokens[:1, :3]).logits

    assert torch.autograd.gradcheck(logits_of, (annotations[:1].detach().requires_grad_(),), eps=1e-6, atol=1e-5)


def test_config_builds_the_glimpse_and_rejects_what_cannot_work():
    config = load_config(None, ["model.extras.glimpses=2", "model.extras.position=coordinates"])
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=GRID)
    second = decoder.attention.second
    assert second.score.query.in_features == config.model.hidden_dim + D + 2  # [h; z_t], z_t is D + 2
    assert decoder.lstm.input_size == config.model.embed_dim + 2 * (D + 2)
    paper = build_decoder(load_config(None, []).model, vocab_size=V, annotation_dim=D)
    assert not isinstance(paper.attention, TwoGlimpses)
    with pytest.raises(ConfigError, match="model.extras.glimpses must be 1 or 2"):
        load_config(None, ["model.extras.glimpses=3"])
    with pytest.raises(ConfigError, match="model.extras.glimpses=2 needs model.attention=soft"):
        load_config(None, ["model.extras.glimpses=2", "model.attention=hard"])
