"""The straightforward implementation, kept as the "before" that benchmarks/run.py times the package against
(`--impl reference`; tests/model/test_fused.py holds it to the same model).

This is the decoder's teacher-forced loop and the batched beam search as they were at main c47c7db,
rewritten only to read the decoder's submodules directly (so that they do not change when the
decoder's fast paths do). The one addition is beam search's `min_length`, which the timing cases
need (it forbids <end> before that step; 0 leaves the search exactly as it was).

Notation: B batch (images), K beams, T steps, L grid cells, D annotation channels, E embedding,
H hidden, A attention size, V vocabulary. Soft attention with the additive score only.
"""

from __future__ import annotations

import torch

from captioning.data.vocab import Vocabulary
from captioning.model.decoding import Captions
from captioning.model.paper import AttentionDecoder, DecoderOutput


def prepare(decoder: AttentionDecoder, annotations: torch.Tensor):
    """keys [B, L, A], h_0, c_0 [B, H]."""
    mean = annotations.mean(dim=1)  # [B, D]
    keys = decoder.attention.score.key(annotations)  # [B, L, A]
    return keys, torch.tanh(decoder.init_h(mean)), decoder.init_c(mean)


def advance(decoder: AttentionDecoder, annotations: torch.Tensor, keys: torch.Tensor, h: torch.Tensor,
            c: torch.Tensor, embedded: torch.Tensor):
    """One step: attend with h_{t-1}, gate, LSTMCell. -> h, c, z [B, D], alpha [B, L]."""
    score = decoder.attention.score
    query = score.query(h)  # [B, A]
    e = score.v(torch.tanh(keys + query[:, None, :])).squeeze(2)  # [B, L]
    alpha = torch.softmax(e, dim=1)
    context = torch.bmm(alpha[:, None, :], annotations).squeeze(1)  # [B, D]
    z = torch.sigmoid(decoder.gate(h)) * context
    h, c = decoder.lstm(torch.cat([embedded, z], dim=1), (h, c))
    return h, c, z, alpha


def output(decoder: AttentionDecoder, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Deep output, Eq. 7."""
    d = decoder
    return d.out(d.dropout(embedded + d.out_h(d.dropout(h)) + d.out_z(z)))


def forward(decoder: AttentionDecoder, annotations: torch.Tensor, inputs: torch.Tensor) -> DecoderOutput:
    """Teacher forcing over every step of every row (padding included). inputs [B, T]."""
    keys, h, c = prepare(decoder, annotations)
    embedded = decoder.embed(inputs)  # [B, T, E]
    hs, zs, alphas = [], [], []
    for t in range(inputs.shape[1]):
        h, c, z, alpha = advance(decoder, annotations, keys, h, c, embedded[:, t])
        hs.append(h)
        zs.append(z)
        alphas.append(alpha)
    logits = output(decoder, embedded, torch.stack(hs, 1), torch.stack(zs, 1))  # [B, T, V]
    return DecoderOutput(logits=logits, alphas=torch.stack(alphas, 1))


def _lengths(tokens: torch.Tensor, end_id: int) -> torch.Tensor:
    is_end = tokens == end_id
    return torch.where(is_end.any(-1), is_end.float().argmax(-1), torch.full_like(tokens[..., 0], tokens.shape[-1]))


@torch.no_grad()
def beam_search(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int = 3, max_length: int = 20,
                length_penalty: float = 0.0, min_length: int = 0) -> Captions:
    """Batched beam search as at c47c7db: memory copied per beam, tokens/alphas grown with cat."""
    batch, cells = annotations.shape[0], annotations.shape[1]
    device = annotations.device
    keys, h, c = prepare(decoder, annotations)
    rows = torch.arange(batch, device=device).repeat_interleave(beam_size)  # [B*K]
    annotations, keys = annotations.index_select(0, rows), keys.index_select(0, rows)
    h, c = h.index_select(0, rows), c.index_select(0, rows)
    scores = torch.full((batch, beam_size), float("-inf"), device=device)
    scores[:, 0] = 0.0
    previous = torch.full((batch * beam_size,), Vocabulary.start_id, dtype=torch.long, device=device)
    finished = torch.zeros(batch, beam_size, dtype=torch.bool, device=device)
    tokens = torch.zeros(batch, beam_size, 0, dtype=torch.long, device=device)  # [B, K, t]
    alphas = torch.zeros(batch, beam_size, 0, cells, device=device)  # [B, K, t, L]
    offsets = torch.arange(batch, device=device)[:, None] * beam_size  # [B, 1]
    for step in range(max_length):
        embedded = decoder.embed(previous)
        h, c, z, alpha = advance(decoder, annotations, keys, h, c, embedded)
        logits = output(decoder, embedded, h, z)
        log_probs = torch.log_softmax(logits.float(), dim=1).view(batch, beam_size, -1)  # [B, K, V]
        if step < min_length:
            log_probs[:, :, Vocabulary.end_id] = float("-inf")
        vocab_size = log_probs.shape[2]
        frozen = torch.full_like(log_probs[0, 0], float("-inf"))
        frozen[Vocabulary.pad_id] = 0.0
        log_probs = torch.where(finished[:, :, None], frozen, log_probs)
        candidates = (scores[:, :, None] + log_probs).view(batch, -1)  # [B, K*V]
        scores, best = candidates.topk(beam_size, dim=1)  # [B, K]
        parent, word = best // vocab_size, best % vocab_size
        flat = (offsets + parent).view(-1)
        h, c = h.index_select(0, flat), c.index_select(0, flat)
        tokens = torch.cat([tokens.gather(1, parent[:, :, None].expand_as(tokens)), word[:, :, None]], dim=2)
        alpha = alpha.index_select(0, flat).view(batch, beam_size, 1, cells)
        alphas = torch.cat([alphas.gather(1, parent[:, :, None, None].expand_as(alphas)), alpha], dim=2)
        finished = finished.gather(1, parent) | (word == Vocabulary.end_id)
        previous = word.view(-1)
        if finished.all():
            break
    lengths = _lengths(tokens, Vocabulary.end_id)
    ranking = scores / (lengths + 1).float() ** length_penalty if length_penalty > 0 else scores
    choice = ranking.argmax(dim=1)
    pick = torch.arange(batch, device=device)
    return Captions(tokens=tokens[pick, choice], alphas=alphas[pick, choice], lengths=lengths[pick, choice],
                    scores=scores[pick, choice])
