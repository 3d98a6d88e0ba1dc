"""Test-time mirroring (studies/flickr8k/mirror_decoding.py): a decoder that reads the mirror image's
half of the joined annotations says "right" where it would say "left", and its map is the photo's.

The reference is a property of the paper's soft attention, not the study's code: with the additive
score the decoder has no notion of where a cell is (h_0 and c_0 come from the mean annotation, the
context is a weighted sum), so annotations whose grid columns are flipped give the same words and
the same map, flipped. A "mirror image" made that way must therefore give the photo's own words
with left and right traded, and, flipped back, the photo's own map."""

from __future__ import annotations

import pytest
import torch

from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.model.decoding import beam_search
from captioning.model.paper import AdditiveScore, AttentionDecoder, SoftAttention
from studies.flickr8k.mirror_decoding import View, swapped_ids

pytestmark = pytest.mark.study

GRID, D, WORDS = (3, 4), 6, ["a", "dog", "left", "right", "runs", "to", "the"]


def model() -> tuple[AttentionDecoder, Vocabulary]:
    torch.manual_seed(0)
    vocab = Vocabulary([*SPECIALS, *WORDS])
    attention = SoftAttention(AdditiveScore(annotation_dim=D, hidden_dim=16, attention_dim=8))
    decoder = AttentionDecoder(vocab_size=len(vocab), annotation_dim=D, embed_dim=8, hidden_dim=16,
                               attention=attention, dropout=0.0)
    with torch.no_grad():  # "left" and "right" likely, so that trading them shows
        decoder.out.bias[[vocab.index["left"], vocab.index["right"]]] += torch.tensor([3.0, 1.0])
    return decoder.eval(), vocab


def flipped_columns(annotations: torch.Tensor) -> torch.Tensor:
    return annotations.unflatten(1, GRID).flip(2).flatten(1, 2)  # [B, L, D]


def test_swapped_ids_trade_left_and_right_only():
    _, vocab = model()
    swap = swapped_ids(vocab)
    assert vocab.decode(swap[torch.tensor([vocab.index[w] for w in WORDS])].tolist()) == [
        "a", "dog", "right", "left", "runs", "to", "the"]


def test_the_mirror_images_view_says_the_photos_words_mirrored_and_maps_the_photos_cells():
    decoder, vocab = model()
    photo = torch.randn(2, GRID[0] * GRID[1], D, generator=torch.Generator().manual_seed(1))
    joined = torch.cat([photo, flipped_columns(photo)], dim=2)  # [B, L, 2D]
    own = beam_search(decoder, photo, beam_size=3, max_length=6)
    seen = beam_search(View(decoder, part=1, channels=D, swap=swapped_ids(vocab), grid=GRID), joined,
                       beam_size=3, max_length=6)
    said = [vocab.decode(row) for row in own.tokens.tolist()]
    assert any("left" in words for words in said)  # the trade is seen
    assert [vocab.decode(row) for row in seen.tokens.tolist()] == [
        [{"left": "right", "right": "left"}.get(w, w) for w in words] for words in said]
    torch.testing.assert_close(seen.alphas, own.alphas, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(seen.scores, own.scores, atol=1e-5, rtol=1e-4)


def test_the_photos_view_reads_the_photos_half():
    decoder, vocab = model()
    photo = torch.randn(2, GRID[0] * GRID[1], D, generator=torch.Generator().manual_seed(2))
    other = torch.randn_like(photo)
    own = beam_search(decoder, photo, beam_size=3, max_length=6)
    seen = beam_search(View(decoder, part=0, channels=D, swap=None, grid=GRID), torch.cat([photo, other], dim=2),
                       beam_size=3, max_length=6)
    assert torch.equal(seen.tokens, own.tokens)
    torch.testing.assert_close(seen.scores, own.scores)
