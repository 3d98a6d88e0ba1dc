"""Self-attention (model.extras.word_attention, model.extras.grid_attention): over the words said so
far, causal, the same under teacher forcing and step by step, its keys and values carried per beam;
over the grid, a multi-head attention that starts as the identity and composes with every score
and both kinds of attention."""

from __future__ import annotations

import math

import pytest
import torch

from captioning.config import load_config
from captioning.config.registry import SCORES
from captioning.model.decoding import beam_search, greedy
from captioning.model.encoder_decoder import build_decoder
from captioning.model.extras.grid_attention import GridSelfAttention
from captioning.model.extras.word_attention import WordSelfAttention
from captioning.model.paper import AttentionDecoder, PreviousState
from captioning.model.tokens import START_ID
from tests.model.extras.test_glimpses import (
    GRID,
    D,
    T,
    V,
    assert_search_scores_its_captions,
    assert_teacher_forcing_equals_stepping,
    make_inputs,
)


def make_decoder(seed: int = 0, *overrides: str, words: bool = True, heads: int = 0) -> AttentionDecoder:
    torch.manual_seed(seed)
    config = load_config(None, [f"model.extras.word_attention={str(words).lower()}",
                                f"model.extras.grid_attention={heads}", "model.embed_dim=8", "model.hidden_dim=16",
                                "model.attention_dim=8", "model.dropout=0", *overrides])
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=GRID).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(3.0)  # captions that end at varied lengths
        for module in decoder.modules():
            if isinstance(module, GridSelfAttention):
                module.out.weight.normal_(0, 0.5)  # away from its identity start, so that it shows
    return decoder


def test_the_recalled_words_are_the_softmax_of_scaled_dot_products_over_the_states_so_far():
    """Word t's query from h_{t-1}, keys and values of h_0 .. h_{t-1}: s_t = V softmax(K^T q / sqrt(p)),
    and the attention query [h_{t-1}; s_t]; recomputed here from the states alone."""
    decoder = make_decoder(3)
    annotations, tokens = make_inputs()
    words: WordSelfAttention = decoder.query
    with torch.no_grad():
        memory, state = decoder.start(annotations)
        states = [state.h]
        for t in range(3):
            _, state, _ = decoder.next_word(memory, state, tokens[:, t])
            states.append(state.h)
        query, after = words(state, decoder.embed(tokens[:, 3]))
        h = torch.stack(states, dim=1)  # [B, 4, H]: h_0 .. h_3
        scores = (words.k(h) @ words.q(states[-1])[:, :, None])[:, :, 0] / math.sqrt(words.key_dim)  # [B, 4]
        weights = torch.softmax(scores, dim=1)
        recalled = (weights[:, :, None] * words.v(h)).sum(1)  # [B, p]
    torch.testing.assert_close(after.word_alphas, weights)
    torch.testing.assert_close(query, torch.cat([states[-1], recalled], dim=1))
    assert after.carried.keys.shape == (3, 4, 8)  # one key per state so far, carried to the next word


def test_later_words_never_change_what_came_before():
    """Causal: changing the input words from position 4 on leaves the logits and maps of positions
    0..3 as they were; position 4 reads the changed word itself."""
    decoder = make_decoder(1)
    annotations, tokens = make_inputs(2)
    changed = tokens.clone()
    changed[:, 4:] = (tokens[:, 4:] + 1 - 4) % (V - 4) + 4  # other words, never specials
    with torch.no_grad():
        first, second = decoder(annotations, tokens), decoder(annotations, changed)
    torch.testing.assert_close(first.logits[:, :4], second.logits[:, :4])
    torch.testing.assert_close(first.alphas[:, :5], second.alphas[:, :5])  # map t is queried before word t is read
    assert not torch.allclose(first.logits[:, 4:], second.logits[:, 4:])
    assert not torch.allclose(first.alphas[:, 5:], second.alphas[:, 5:])  # later maps do see them


@pytest.mark.parametrize("overrides", [(), ("model.attention=hard",), ("model.extras.query_word=true",),
                                       ("model.extras.glimpses=2",)])
def test_teacher_forcing_with_ragged_lengths_equals_step_by_step(overrides):
    decoder = make_decoder(1, *overrides, heads=2)  # hard attention at test time: the expectation
    annotations, tokens = make_inputs(2)
    lengths = torch.tensor([4, T, 2])  # unsorted: the packed path sorts the rows and drops the finished ones
    assert_teacher_forcing_equals_stepping(decoder, annotations, tokens, lengths)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_beam_search_carries_each_beams_keys_and_values(beam_size):
    """Each beam continues from its own parent's keys and values: the search's scores and maps are
    those of teacher forcing on the captions it returns (not so if the cache stays in place)."""
    decoder = make_decoder(6, heads=2)
    annotations, _ = make_inputs(7)
    captions = beam_search(decoder, annotations, beam_size=beam_size, max_length=6)
    assert captions.lengths.tolist() == ([6, 6, 0] if beam_size == 3 else [6, 6, 6])  # words to carry keys for
    if beam_size == 1:
        greedy_captions = greedy(decoder, annotations, max_length=6)
        assert torch.equal(captions.tokens, greedy_captions.tokens)
        torch.testing.assert_close(captions.word_alphas, greedy_captions.word_alphas)
    assert_search_scores_its_captions(decoder, annotations, captions)
    # the word weights it reports are those of stepping through the captions it returns
    inputs = torch.cat([torch.full_like(captions.tokens[:, :1], START_ID), captions.tokens[:, :-1]], dim=1)
    with torch.no_grad():
        memory, state = decoder.start(annotations)
        for t in range(inputs.shape[1]):
            _, state, _ = decoder.next_word(memory, state, inputs[:, t])
            said = t <= captions.lengths  # the words up to <end>; after it, a finished beam only pads
            torch.testing.assert_close(captions.word_alphas[said, t, :t + 1], state.word_alphas[said])


def test_decoding_returns_each_words_weights_over_the_words_before_it():
    decoder = make_decoder(2)
    annotations, _ = make_inputs(3)
    captions = greedy(decoder, annotations, max_length=6)
    steps = captions.tokens.shape[1]
    assert captions.word_alphas.shape == (3, steps, steps)
    torch.testing.assert_close(captions.word_alphas.sum(2), torch.ones(3, steps))  # a distribution per word
    later = torch.triu(torch.ones(steps, steps, dtype=torch.bool), diagonal=1)  # j > t: words not said yet
    assert (captions.word_alphas[:, later] == 0).all()
    assert (captions.word_alphas[:, ~later] > 0).all()
    assert greedy(make_decoder(2, words=False), annotations, max_length=6).word_alphas is None


def test_grid_attention_is_multi_head_attention_added_to_the_annotations():
    """a + W_o MultiHead(a): torch's own nn.MultiheadAttention with the same weights is the reference."""
    torch.manual_seed(0)
    grid = GridSelfAttention(annotation_dim=D, heads=2)
    annotations = torch.randn(3, 12, D)
    assert torch.equal(grid(annotations), annotations)  # W_o starts at zero: the paper's annotations
    with torch.no_grad():
        grid.out.weight.normal_()
        reference = torch.nn.MultiheadAttention(D, 2, bias=False, batch_first=True)
        reference.in_proj_weight.copy_(grid.qkv.weight)
        reference.out_proj.weight.copy_(grid.out.weight)
        want = annotations + reference(annotations, annotations, annotations, need_weights=False)[0]
        torch.testing.assert_close(grid(annotations), want)
        order = torch.randperm(12)
        torch.testing.assert_close(grid(annotations[:, order]), grid(annotations)[:, order])  # no cell is special
    with pytest.raises(ValueError, match="3 heads must divide the 8 annotation channels"):
        GridSelfAttention(annotation_dim=D, heads=3)
    assert GridSelfAttention(annotation_dim=D, heads=1).key_dim == D  # one head: the whole width


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_both_self_attentions_compose_with_every_score_and_both_kinds(score, kind):
    decoder = make_decoder(5, f"model.score={score}", f"model.attention={kind}", heads=2).train()
    annotations, tokens = make_inputs(6)
    output = decoder(annotations.requires_grad_(), tokens)
    output.logits.sum().backward()
    assert annotations.grad.abs().sum() > 0
    grid = next(m for m in decoder.attention.inputs if isinstance(m, GridSelfAttention))
    assert grid.qkv.weight.grad.abs().sum() > 0 and decoder.query.q.weight.grad.abs().sum() > 0


def test_grid_attention_keeps_the_fused_path_and_word_attention_leaves_it():
    assert make_decoder(0, words=False, heads=2).accelerator is not None
    assert make_decoder(0, words=True).accelerator is None
    assert isinstance(make_decoder(0, words=False).query, PreviousState)
