"""Several decoders decoded together: each step's word distribution is the mean of the members'
probabilities. Held against the members' own teacher-forced forward (another code path than the
decoding steps), and against one member decoding alone."""

from __future__ import annotations

import copy

import pytest
import torch

from captioning.data.vocab import Vocabulary
from captioning.model.decoding import beam_search, greedy
from captioning.model.ensemble import Ensemble, JoinedEncoder
from captioning.model.paper import AdditiveScore, AttentionDecoder, SoftAttention
from tests.model.test_fused import D, V, make_batch, make_decoder


def members(*seeds: int):
    """Untrained decoders that never say <end> (every search runs its max_length steps), made sharp
    enough that their words depend on the words before: the best beam descends from other beams than
    the first, so a member whose rows a reordering left behind would score other words."""
    decoders = [make_decoder(seed, dtype=torch.float32).eval() for seed in seeds]
    with torch.no_grad():
        for decoder in decoders:
            decoder.out.weight.mul_(3.0)
            decoder.out.bias[Vocabulary.end_id] = -1e4
    return decoders


def teacher_forced(decoders, annotations, tokens):
    """Each member's teacher-forced forward on the chosen words: the mean of their word
    probabilities [B, T, V] and of their maps [B, T, L]."""
    inputs = torch.cat([torch.full_like(tokens[:, :1], Vocabulary.start_id), tokens[:, :-1]], dim=1)
    with torch.no_grad():
        outputs = [d(annotations, inputs) for d in decoders]
    probs = torch.stack([torch.softmax(out.logits, dim=2) for out in outputs]).mean(0)
    return probs, torch.stack([out.alphas for out in outputs]).mean(0)


def teacher_forced_mean_log_prob(decoders, annotations, tokens):
    """log mean_m p_m(y_t | y_<t) of each chosen word. [B, T]"""
    probs, _ = teacher_forced(decoders, annotations, tokens)
    return probs.gather(2, tokens[:, :, None])[:, :, 0].log()


def said_words(tokens):
    """[B, T] True for the words up to and including <end>."""
    ends = (tokens == Vocabulary.end_id).long()
    return (torch.cumsum(ends, dim=1) - ends) == 0


@pytest.mark.parametrize("beam_size", [1, 3])
def test_an_ensemble_scores_its_caption_with_the_mean_of_the_members_probabilities(beam_size):
    decoders, annotations = members(1, 2, 3), make_batch(dtype=torch.float32)[0]
    ensemble = Ensemble(decoders).eval()
    captions = (greedy(ensemble, annotations, max_length=6) if beam_size == 1
                else beam_search(ensemble, annotations, beam_size=beam_size, max_length=6))
    reference = teacher_forced_mean_log_prob(decoders, annotations, captions.tokens)  # [B, T]
    said = captions.tokens != Vocabulary.pad_id  # the words and <end>
    torch.testing.assert_close(captions.scores, (reference * said).sum(1), rtol=1e-4, atol=1e-4)


def test_greedy_picks_the_word_the_mean_probability_ranks_first():
    decoders, annotations = members(1, 2), make_batch(dtype=torch.float32)[0]
    captions = greedy(Ensemble(decoders).eval(), annotations, max_length=6)
    probs, _ = teacher_forced(decoders, annotations, captions.tokens)
    probs[:, :, [Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.unk_id]] = 0  # never said (decoding's rule)
    said = said_words(captions.tokens)
    assert torch.equal(probs.argmax(2)[said], captions.tokens[said])


def test_one_decoder_twice_decodes_as_that_decoder_alone():
    decoder, annotations = members(1)[0], make_batch(dtype=torch.float32)[0]
    alone = beam_search(decoder, annotations, beam_size=3, max_length=6)
    twice = beam_search(Ensemble([decoder, copy.deepcopy(decoder)]).eval(), annotations, beam_size=3, max_length=6)
    assert torch.equal(alone.tokens, twice.tokens)
    torch.testing.assert_close(alone.scores, twice.scores)
    torch.testing.assert_close(alone.alphas, twice.alphas)


def test_a_word_map_is_the_mean_of_the_members_maps():
    decoders, annotations = members(1, 2), make_batch(dtype=torch.float32)[0]
    captions = greedy(Ensemble(decoders).eval(), annotations, max_length=6)
    _, maps = teacher_forced(decoders, annotations, captions.tokens)
    said = said_words(captions.tokens)
    torch.testing.assert_close(captions.alphas[said], maps[said], rtol=1e-4, atol=1e-5)


def test_an_ensemble_needs_two_members_and_does_not_train():
    with pytest.raises(ValueError, match="at least two"):
        Ensemble(members(0))
    with pytest.raises(TypeError, match="decodes only"):
        Ensemble(members(1, 2))(torch.zeros(1, 9, 8), torch.zeros(1, 3, dtype=torch.long))


def test_members_with_views_each_read_their_own_annotations():
    """Members over different encoders (one fine-tuned): the search sees their annotations side by
    side, and each member's words and maps are those of its own view, whichever order they lie in."""
    decoders = members(1, 2)
    own = [make_batch(seed, dtype=torch.float32)[0] for seed in (5, 6)]  # [B, L, D] each: member 0's, member 1's
    joined = torch.cat([own[1], own[0]], dim=2)  # views: member 1's first
    captions = beam_search(Ensemble(decoders, views=[1, 0]).eval(), joined, beam_size=3, max_length=6)
    inputs = torch.cat([torch.full_like(captions.tokens[:, :1], Vocabulary.start_id), captions.tokens[:, :-1]], 1)
    with torch.no_grad():
        outputs = [decoder(annotations, inputs) for decoder, annotations in zip(decoders, own)]
    probs = torch.stack([torch.softmax(out.logits, dim=2) for out in outputs]).mean(0)  # [B, T, V]
    reference = probs.gather(2, captions.tokens[:, :, None])[:, :, 0].log()
    said = captions.tokens != Vocabulary.pad_id
    torch.testing.assert_close(captions.scores, (reference * said).sum(1), rtol=1e-4, atol=1e-4)


def test_views_are_one_per_member_none_left_out_and_of_one_width_each():
    with pytest.raises(ValueError, match="one per member"):
        Ensemble(members(1, 2), views=[0])
    with pytest.raises(ValueError, match="none left out"):
        Ensemble(members(1, 2), views=[0, 2])
    score = AdditiveScore(annotation_dim=D + 4, hidden_dim=16, attention_dim=7)
    wide = AttentionDecoder(vocab_size=V, annotation_dim=D + 4, embed_dim=6, hidden_dim=16,
                            attention=SoftAttention(score))
    with pytest.raises(ValueError, match=f"view 0 is read by members of {D} and {D + 4} channels"):
        Ensemble([members(1)[0], wide], views=[0, 0])
    assert Ensemble([members(1)[0], wide], views=[0, 1]).dim == 2 * D + 4
    with pytest.raises(ValueError, match=f"read {2 * D} channels"):
        greedy(Ensemble(members(1, 2), views=[0, 1]).eval(), make_batch(dtype=torch.float32)[0], max_length=3)


def test_a_joined_encoder_runs_the_stages_its_encoders_share_once_and_gives_each_its_own_annotations(encoder):
    """A fine-tuned copy (its last stage moved) beside the pretrained encoder: the stages before run
    once, and the joined annotations are each encoder's own, side by side."""
    tuned = copy.deepcopy(encoder)
    names = [name for name, _ in encoder.body.named_children()]
    with torch.no_grad():
        for value in getattr(tuned.body, names[-1]).parameters():
            value.mul_(1.1)
    padded = copy.deepcopy(encoder)
    for module in padded.modules():  # the same weights, another border: not the same stage
        if isinstance(module, torch.nn.Conv2d):
            module.padding_mode = "reflect"
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        joined, grid = JoinedEncoder([encoder, tuned]).eval()(pixels)
        alone = [e.eval()(pixels) for e in (encoder, tuned)]
    assert JoinedEncoder([encoder, tuned]).shared == len(names) - 1
    assert JoinedEncoder([encoder, padded]).shared == 0
    assert grid == alone[0][1] and joined.shape[2] == 2 * encoder.dim
    torch.testing.assert_close(joined, torch.cat([alone[0][0], alone[1][0]], dim=2))
