"""The previous word in the attention query (model.extras.query_word): q_t = [h_{t-1}; E y_{t-1}]."""

from __future__ import annotations

import pytest
import torch

from captioning.config import load_config
from captioning.model.decoding import beam_search
from captioning.model.encoder_decoder import build_decoder
from captioning.model.extras.query_word import WordInQuery
from captioning.model.paper import AttentionDecoder, PreviousState
from tests.model.extras.test_glimpses import (
    GRID,
    D,
    T,
    V,
    assert_search_scores_its_captions,
    assert_teacher_forcing_equals_stepping,
    make_inputs,
)


def make_decoder(seed: int = 0, *overrides: str) -> AttentionDecoder:
    """From the config, as train.py builds it: the word in the query, small sizes, no dropout."""
    torch.manual_seed(seed)
    config = load_config(None, ["model.extras.query_word=true", "model.embed_dim=8", "model.hidden_dim=16",
                                "model.attention_dim=8", "model.dropout=0", *overrides])
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=GRID).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(3.0)  # captions that end at varied lengths
    return decoder


def test_the_additive_map_is_computed_from_the_state_and_the_previous_word():
    """alpha_t = softmax(v^T tanh(W_a a_i + b + W_q [h_{t-1}; E y_{t-1}])), the word's embedding unprojected."""
    decoder = make_decoder(3)
    annotations, tokens = make_inputs()
    with torch.no_grad():
        memory, state = decoder.start(annotations)
        _, state, _ = decoder.next_word(memory, state, tokens[:, 0])
        score = decoder.attention.score
        query = torch.cat([state.h, decoder.embed(tokens[:, 1])], dim=1)  # [B, H + E]
        e = score.v(torch.tanh(score.key(annotations) + score.query(query)[:, None])).squeeze(2)  # [B, L]
        _, _, attended = decoder.next_word(memory, state, tokens[:, 1])
    assert score.query.in_features == 16 + 8
    torch.testing.assert_close(attended.alpha, torch.softmax(e, dim=1))


@pytest.mark.parametrize("glimpses", [1, 2])
def test_the_map_for_a_word_sees_the_word_before_it_and_nothing_later(glimpses):
    """The paper's alpha_t depends on y_{<t-1} only (tests/model/test_decoder.py); with the word in the query
    it also depends on y_{t-1}, the token fed at step t, and still on nothing after it."""
    decoder = make_decoder(1, f"model.extras.glimpses={glimpses}")
    annotations, tokens = make_inputs()
    changed = tokens.clone()
    changed[:, 3:] = (changed[:, 3:] + 1 - 4) % (V - 4) + 4  # other real words from step 3 on
    with torch.no_grad():
        output = decoder(annotations, tokens)
        other = decoder(annotations, changed)
    torch.testing.assert_close(other.alphas[:, :3], output.alphas[:, :3])
    assert (other.alphas[:, 3] - output.alphas[:, 3]).abs().max() > 1e-4  # fed the changed word: a new map
    paper = make_decoder(1, f"model.extras.glimpses={glimpses}", "model.extras.query_word=false")
    with torch.no_grad():
        torch.testing.assert_close(paper(annotations, changed).alphas[:, 3], paper(annotations, tokens).alphas[:, 3])


@pytest.mark.parametrize("overrides", [
    ("model.extras.glimpses=1",),
    ("model.extras.glimpses=2", "model.score=local", "model.extras.position=coordinates", "model.extras.init=layout"),
    ("model.attention=hard",),
], ids=["one_glimpse", "two_glimpses_local", "hard"])
def test_teacher_forcing_with_ragged_lengths_equals_step_by_step(overrides):
    decoder = make_decoder(2, *overrides)
    annotations, tokens = make_inputs(2)
    lengths = torch.tensor([4, T, 2])  # unsorted, so the packed path sorts and shrinks the batch
    assert decoder.accelerator is None  # the fused recurrence queries with h_{t-1} alone
    assert_teacher_forcing_equals_stepping(decoder, annotations, tokens, lengths)


@pytest.mark.parametrize("glimpses", [1, 2])
def test_beam_search_scores_the_caption_it_returns(glimpses):
    """Beam search feeds each hypothesis its own last word: the maps must follow that word, not another beam's."""
    decoder = make_decoder(4, f"model.extras.glimpses={glimpses}")
    annotations, _ = make_inputs(5)
    captions = beam_search(decoder, annotations, beam_size=3, max_length=6)
    assert_search_scores_its_captions(decoder, annotations, captions)


def test_config_sizes_both_queries_and_the_paper_keeps_its_own():
    config = load_config(None, ["model.extras.query_word=true", "model.extras.glimpses=2",
                                "model.extras.position=coordinates"])
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=GRID)
    m = config.model
    assert isinstance(decoder.query, WordInQuery)
    assert decoder.attention.first.score.query.in_features == m.hidden_dim + m.embed_dim  # [h; E y]
    assert decoder.attention.second.score.query.in_features == m.hidden_dim + m.embed_dim + D + 2  # [h; E y; z_t]
    paper = build_decoder(load_config(None, []).model, vocab_size=V, annotation_dim=D)
    assert isinstance(paper.query, PreviousState) and paper.accelerator is not None  # the paper's query: fused
    assert paper.attention.score.query.in_features == m.hidden_dim
