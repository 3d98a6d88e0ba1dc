"""Caption generation: greedy decoding and batched beam search, both returning attention maps.

Notation: B images, K beams, T steps, L grid cells, V vocabulary size.

Beam search runs all images and all beams as one [B*K] batch: one decoder step per word for the
whole batch, never a loop over images; the image-side work is done once per image, not per beam.

Hard attention picks its cell at test time by `hard_choice`: "expectation" (the paper's default),
"argmax" or "sample"; the chosen cells come back in `locations`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from captioning.model import fused
from captioning.model.attention import choosing
from captioning.model.decoder import AttentionDecoder, DecoderState
from captioning.model.tokens import END_ID, PAD_ID, START_ID

# One decoding step: (state, previous tokens [N]) -> logits [N, V], new state, alpha [N, L], chosen cell [N].
Step = Callable[[DecoderState, torch.Tensor], tuple[torch.Tensor, DecoderState, torch.Tensor, torch.Tensor]]


@dataclass
class Captions:
    tokens: torch.Tensor  # [B, T] generated ids, <end> included where emitted, then <pad>
    alphas: torch.Tensor  # [B, T, L]; alphas[b, t] is the map used to generate tokens[b, t]
    lengths: torch.Tensor  # [B] words before <end>
    scores: torch.Tensor  # [B] summed log-probabilities (before any length normalization)
    locations: torch.Tensor | None = None  # [B, T] hard attention's chosen cell per word, -1 for the expectation


def _lengths(tokens: torch.Tensor, end_id: int) -> torch.Tensor:
    """Words before the first <end> (all of them if none). tokens [..., T] -> [...]."""
    is_end = tokens == end_id
    first = torch.where(is_end.any(-1), is_end.float().argmax(-1), torch.full_like(tokens[..., 0], tokens.shape[-1]))
    return first


def _stepper(decoder: AttentionDecoder, annotations: torch.Tensor, group: int) -> tuple[Step, DecoderState]:
    """One decoding step for `group` hypotheses per image, and the initial state [B*group, H].

    The image-side work (keys, h_0, c_0) is done once per image. Soft attention with the additive
    score shares each image's memory among its hypotheses (captioning.model.fused.GroupedStep); any other
    attention gets the memory rows repeated once per hypothesis. Soft attention chooses no cell:
    its locations are -1.
    """
    memory, state = decoder.prepare(annotations)
    rows = torch.arange(annotations.shape[0], device=annotations.device).repeat_interleave(group)  # [B*group]
    state = state.select(rows)
    none = torch.full((rows.shape[0],), -1, dtype=torch.long, device=annotations.device)  # [B*group]
    if decoder.fusable:
        grouped = fused.GroupedStep(decoder, keys=memory.keys, annotations=memory.annotations, group=group)

        def step(state: DecoderState, tokens: torch.Tensor):
            logits, h, c, alpha = grouped(state.h, state.c, tokens)
            return logits, DecoderState(h, c), alpha, none
    else:
        repeated = memory.select(rows) if group > 1 else memory

        def step(state: DecoderState, tokens: torch.Tensor):
            logits, state, attended = decoder.step(repeated, state, tokens)
            return logits, state, attended.alpha, attended.location if attended.location is not None else none
    return step, state


@torch.no_grad()
def greedy(decoder: AttentionDecoder, annotations: torch.Tensor, *, max_length: int = 20) -> Captions:
    """The most likely word at every step. annotations [B, L, D]."""
    step, state = _stepper(decoder, annotations, 1)
    batch = annotations.shape[0]
    previous = torch.full((batch,), START_ID, dtype=torch.long, device=annotations.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=annotations.device)
    scores = torch.zeros(batch, device=annotations.device)
    tokens, alphas, locations = [], [], []
    for _ in range(max_length):
        logits, state, alpha, location = step(state, previous)
        log_probs = torch.log_softmax(logits.float(), dim=1)  # [B, V]
        best, word = log_probs.max(dim=1)  # [B]
        word = word.masked_fill(finished, PAD_ID)
        scores += best.masked_fill(finished, 0.0)
        tokens.append(word)
        alphas.append(alpha)
        locations.append(location)
        finished |= word == END_ID
        previous = word
        if finished.all():
            break
    tokens_t = torch.stack(tokens, 1)  # [B, T]
    return Captions(tokens=tokens_t, alphas=torch.stack(alphas, 1), lengths=_lengths(tokens_t, END_ID),
                    scores=scores, locations=torch.stack(locations, 1))


@torch.no_grad()
def beam_search(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int = 3, max_length: int = 20,
                length_penalty: float = 0.0, min_length: int = 0) -> Captions:
    """Batched beam search. annotations [B, L, D].

    A finished beam stays in the beam with a frozen score (it can only continue with <pad> at no
    cost), so it competes fairly with the open ones. With length_penalty alpha > 0 the final choice
    ranks beams by score / n**alpha, n the tokens its score sums (its words, and <end> where it
    emitted one: words + 1 for a finished beam); a beam that never emitted <end> is still a candidate,
    so every image gets its best hypothesis. min_length forbids <end> before that many words (with
    min_length = max_length every search runs exactly max_length steps, which timing needs).

    Each step writes its words, back-pointers, maps and cells into buffers preallocated for
    max_length steps; the chosen hypothesis is read back through the back-pointers once, at the end,
    instead of reordering and growing every beam's history at every step.
    """
    batch, cells = annotations.shape[0], annotations.shape[1]
    device = annotations.device
    step, state = _stepper(decoder, annotations, beam_size)
    scores = torch.full((batch, beam_size), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    previous = torch.full((batch * beam_size,), START_ID, dtype=torch.long, device=device)
    finished = torch.zeros(batch, beam_size, dtype=torch.bool, device=device)
    words = torch.zeros(max_length, batch, beam_size, dtype=torch.long, device=device)  # [T, B, K]
    parents = torch.zeros(max_length, batch, beam_size, dtype=torch.long, device=device)  # [T, B, K]
    maps = torch.zeros(max_length, batch, beam_size, cells, device=device)  # [T, B, K, L], before reordering
    chosen_cells = torch.zeros(max_length, batch, beam_size, dtype=torch.long, device=device)  # [T, B, K]
    offsets = torch.arange(batch, device=device)[:, None] * beam_size  # [B, 1]
    frozen = None
    steps = 0
    for steps in range(1, max_length + 1):
        logits, state, alpha, location = step(state, previous)
        log_probs = torch.log_softmax(logits.float(), dim=1).view(batch, beam_size, -1)  # [B, K, V]
        vocab_size = log_probs.shape[2]
        if steps <= min_length:
            log_probs[:, :, END_ID] = float("-inf")
        if frozen is None:
            frozen = torch.full_like(log_probs[0, 0], float("-inf"))
            frozen[PAD_ID] = 0.0
        log_probs = torch.where(finished[:, :, None], frozen, log_probs)
        candidates = (scores[:, :, None] + log_probs).view(batch, -1)  # [B, K*V]
        scores, best = candidates.topk(beam_size, dim=1)  # [B, K]
        parent, word = best // vocab_size, best % vocab_size  # [B, K]
        state = state.select((offsets + parent).view(-1))  # [B*K] rows to continue from
        words[steps - 1], parents[steps - 1] = word, parent
        maps[steps - 1] = alpha.view(batch, beam_size, cells)
        chosen_cells[steps - 1] = location.view(batch, beam_size)
        finished = finished.gather(1, parent) | (word == END_ID)
        previous = word.view(-1)
        if finished.all():
            break
    # Every beam's length, read back through the back-pointers, for the final ranking.
    beam = torch.arange(beam_size, device=device).expand(batch, beam_size)  # [B, K]
    history = torch.empty(batch, beam_size, steps, dtype=torch.long, device=device)  # [B, K, T]
    for t in reversed(range(steps)):
        history[:, :, t] = words[t].gather(1, beam)
        beam = parents[t].gather(1, beam)
    lengths = _lengths(history, END_ID)  # [B, K]
    scored = lengths + (history == END_ID).any(dim=2).long()  # [B, K], the words and <end> if emitted
    ranking = scores / scored.float() ** length_penalty if length_penalty > 0 else scores
    choice = ranking.argmax(dim=1)  # [B]
    pick = torch.arange(batch, device=device)
    chosen = torch.empty(batch, steps, cells, device=device)  # [B, T, L]
    locations = torch.empty(batch, steps, dtype=torch.long, device=device)  # [B, T]
    beam = choice[:, None]  # [B, 1]
    for t in reversed(range(steps)):
        source = parents[t].gather(1, beam)[:, 0]  # [B], the row that generated word t of the chosen hypothesis
        chosen[:, t] = maps[t][pick, source]
        locations[:, t] = chosen_cells[t][pick, source]
        beam = source[:, None]
    return Captions(tokens=history[pick, choice], alphas=chosen, lengths=lengths[pick, choice],
                    scores=scores[pick, choice], locations=locations)


def decode(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int = 1, max_length: int = 20,
           length_penalty: float = 0.0, hard_choice: str | None = None) -> Captions:
    """Greedy for beam size 1, beam search otherwise; `hard_choice` as in the module docstring
    (None keeps the model's own choice)."""
    with choosing(decoder, hard_choice):
        if beam_size <= 1:
            return greedy(decoder, annotations, max_length=max_length)
        return beam_search(decoder, annotations, beam_size=beam_size, max_length=max_length,
                           length_penalty=length_penalty)
