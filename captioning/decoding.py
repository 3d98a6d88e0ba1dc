"""Caption generation: greedy decoding and batched beam search, both returning attention maps.

Notation: B images, K beams, T steps, L grid cells, V vocabulary size.

Beam search runs all images and all beams as one [B*K] batch: one decoder step per word for the
whole batch, never a loop over images.

Hard attention picks its cell at test time by `hard_attention`: "expectation" (the paper's default,
as configured at construction), "argmax" or "sample"; the chosen cells come back in `locations`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from captioning.attention import hard_inference
from captioning.decoder import AttentionDecoder
from captioning.vocab import Vocabulary


@dataclass
class Captions:
    tokens: torch.Tensor  # [B, T] generated ids, <end> included where emitted, then <pad>
    alphas: torch.Tensor  # [B, T, L]; alphas[b, t] is the map used to generate tokens[b, t]
    lengths: torch.Tensor  # [B] words before <end>
    scores: torch.Tensor  # [B] summed log-probabilities (before any length normalization)
    locations: torch.Tensor | None = None  # [B, T] hard attention's chosen cell per word, -1 for the expectation


def _cells(location: torch.Tensor | None, batch: int, device: torch.device) -> torch.Tensor:
    """The chosen cells of one step [B]: -1 (none chosen) for soft attention."""
    return location if location is not None else torch.full((batch,), -1, dtype=torch.long, device=device)


def _lengths(tokens: torch.Tensor, end_id: int) -> torch.Tensor:
    """Words before the first <end> (all of them if none). tokens [..., T] -> [...]."""
    is_end = tokens == end_id
    first = torch.where(is_end.any(-1), is_end.float().argmax(-1), torch.full_like(tokens[..., 0], tokens.shape[-1]))
    return first


@torch.no_grad()
def greedy(decoder: AttentionDecoder, annotations: torch.Tensor, *, max_length: int = 20) -> Captions:
    """The most likely word at every step. annotations [B, L, D]."""
    memory, state = decoder.prepare(annotations)
    batch = annotations.shape[0]
    previous = torch.full((batch,), Vocabulary.start_id, dtype=torch.long, device=annotations.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=annotations.device)
    scores = torch.zeros(batch, device=annotations.device)
    tokens, alphas, locations = [], [], []
    for _ in range(max_length):
        logits, state, attended = decoder.step(memory, state, previous)
        locations.append(_cells(attended.location, batch, annotations.device))
        log_probs = torch.log_softmax(logits.float(), dim=1)  # [B, V]
        best, word = log_probs.max(dim=1)  # [B]
        word = word.masked_fill(finished, Vocabulary.pad_id)
        scores += best.masked_fill(finished, 0.0)
        tokens.append(word)
        alphas.append(attended.alpha)
        finished |= word == Vocabulary.end_id
        previous = word
        if finished.all():
            break
    tokens_t = torch.stack(tokens, 1)  # [B, T]
    return Captions(tokens=tokens_t, alphas=torch.stack(alphas, 1), lengths=_lengths(tokens_t, Vocabulary.end_id),
                    scores=scores, locations=torch.stack(locations, 1))


@torch.no_grad()
def beam_search(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int = 3, max_length: int = 20,
                length_penalty: float = 0.0) -> Captions:
    """Batched beam search. annotations [B, L, D].

    A finished beam stays in the beam with a frozen score (it can only continue with <pad> at no
    cost), so it competes fairly with the open ones. With length_penalty alpha > 0 the final choice
    ranks beams by score / (words + 1)**alpha; a beam that never emitted <end> is still a candidate,
    so every image gets its best hypothesis.
    """
    batch, cells = annotations.shape[0], annotations.shape[1]
    device = annotations.device
    memory, state = decoder.prepare(annotations)
    rows = torch.arange(batch, device=device).repeat_interleave(beam_size)  # [B*K], image of each row
    memory, state = memory.select(rows), state.select(rows)  # image-side work was done once per image
    scores = torch.full((batch, beam_size), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    previous = torch.full((batch * beam_size,), Vocabulary.start_id, dtype=torch.long, device=device)
    finished = torch.zeros(batch, beam_size, dtype=torch.bool, device=device)
    tokens = torch.zeros(batch, beam_size, 0, dtype=torch.long, device=device)  # [B, K, t]
    alphas = torch.zeros(batch, beam_size, 0, cells, device=device)  # [B, K, t, L]
    locations = torch.zeros(batch, beam_size, 0, dtype=torch.long, device=device)  # [B, K, t]
    offsets = torch.arange(batch, device=device)[:, None] * beam_size  # [B, 1]
    for _ in range(max_length):
        logits, state, attended = decoder.step(memory, state, previous)
        log_probs = torch.log_softmax(logits.float(), dim=1).view(batch, beam_size, -1)  # [B, K, V]
        vocab_size = log_probs.shape[2]
        frozen = torch.full_like(log_probs[0, 0], float("-inf"))
        frozen[Vocabulary.pad_id] = 0.0
        log_probs = torch.where(finished[:, :, None], frozen, log_probs)
        candidates = (scores[:, :, None] + log_probs).view(batch, -1)  # [B, K*V]
        scores, best = candidates.topk(beam_size, dim=1)  # [B, K]
        parent, word = best // vocab_size, best % vocab_size  # [B, K]
        flat = (offsets + parent).view(-1)  # [B*K] rows to continue from
        state = state.select(flat)
        tokens = torch.cat([tokens.gather(1, parent[:, :, None].expand_as(tokens)), word[:, :, None]], dim=2)
        alpha = attended.alpha.index_select(0, flat).view(batch, beam_size, 1, cells)
        alphas = torch.cat([alphas.gather(1, parent[:, :, None, None].expand_as(alphas)), alpha], dim=2)
        location = _cells(attended.location, batch * beam_size, device).index_select(0, flat).view(batch, beam_size, 1)
        locations = torch.cat([locations.gather(1, parent[:, :, None].expand_as(locations)), location], dim=2)
        finished = finished.gather(1, parent) | (word == Vocabulary.end_id)
        previous = word.view(-1)
        if finished.all():
            break
    lengths = _lengths(tokens, Vocabulary.end_id)  # [B, K]
    ranking = scores / (lengths + 1).float() ** length_penalty if length_penalty > 0 else scores
    choice = ranking.argmax(dim=1)  # [B]
    pick = torch.arange(batch, device=device)
    return Captions(tokens=tokens[pick, choice], alphas=alphas[pick, choice], lengths=lengths[pick, choice],
                    scores=scores[pick, choice], locations=locations[pick, choice])


def decode(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int = 1, max_length: int = 20,
           length_penalty: float = 0.0, hard_attention: str | None = None) -> Captions:
    """Greedy for beam size 1, beam search otherwise; `hard_attention` as in the module docstring
    (None keeps the model's own choice)."""
    with hard_inference(decoder, hard_attention):
        if beam_size <= 1:
            return greedy(decoder, annotations, max_length=max_length)
        return beam_search(decoder, annotations, beam_size=beam_size, max_length=max_length,
                           length_penalty=length_penalty)
