"""Our re-implementation of the loop style of the popular public PyTorch ports of Show, Attend and Tell.

This is NOT their code. It reproduces, on *our* model and parameters (so that the arithmetic of the
model is identical and only the style differs), the patterns that make them slow, as found in the most
widely copied tutorial port (sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning: `models.py`
DecoderWithAttention.forward and Attention.forward, `caption.py` caption_image_beam_search):

- the attention's image-side projection W_a a_i is recomputed at every step (and, in beam search,
  for every beam);
- the batch is sorted by length and re-sliced at every step (`encoder_out[:batch_size_t]`,
  `h[:batch_size_t]`), the context is `(encoder_out * alpha.unsqueeze(2)).sum(dim=1)`, the output
  layer runs inside the loop and its result is written into a preallocated [B, T, V] tensor;
- beam search runs one image at a time, with the image's annotations expanded to the K beams, and
  grows its sequences and maps with torch.cat at every step.

Notation: B batch, T steps, L cells, D channels, K beams, V vocabulary.
"""

from __future__ import annotations

import torch

from captioning.data.vocab import Vocabulary
from captioning.model.decoding import Captions
from captioning.model.paper import AttentionDecoder, DecoderOutput


def _attend(decoder: AttentionDecoder, annotations: torch.Tensor, h: torch.Tensor):
    score = decoder.attention.score
    keys = score.key(annotations)  # [n, L, A]: per-image work, redone at every step
    e = score.v(torch.tanh(keys + score.query(h).unsqueeze(1))).squeeze(2)  # [n, L]
    alpha = torch.softmax(e, dim=1)
    context = (annotations * alpha.unsqueeze(2)).sum(dim=1)  # [n, D]
    return context, alpha


def _step(decoder: AttentionDecoder, annotations, h, c, embedded):
    context, alpha = _attend(decoder, annotations, h)
    z = torch.sigmoid(decoder.gate(h)) * context
    h, c = decoder.lstm(torch.cat([embedded, z], dim=1), (h, c))
    logits = decoder.out(decoder.dropout(embedded + decoder.out_h(decoder.dropout(h)) + decoder.out_z(z)))
    return logits, h, c, alpha


def forward(decoder: AttentionDecoder, annotations: torch.Tensor, inputs: torch.Tensor,
            lengths: torch.Tensor) -> DecoderOutput:
    """Teacher forcing, port style. lengths [B] real steps; outputs in the caller's row order."""
    lengths, order = lengths.sort(descending=True)
    annotations, inputs = annotations[order], inputs[order]
    embedded = decoder.embed(inputs)  # [B, T, E]
    mean = annotations.mean(dim=1)
    h, c = torch.tanh(decoder.init_h(mean)), decoder.init_c(mean)
    decode_lengths = lengths.tolist()
    batch, steps = inputs.shape
    predictions = torch.zeros(batch, steps, decoder.out.out_features)
    alphas = torch.zeros(batch, steps, annotations.shape[1])
    for t in range(max(decode_lengths)):
        n = sum(length > t for length in decode_lengths)
        logits, h, c, alpha = _step(decoder, annotations[:n], h[:n], c[:n], embedded[:n, t, :])
        predictions[:n, t, :] = logits
        alphas[:n, t, :] = alpha
    unsort = torch.empty_like(order)
    unsort[order] = torch.arange(batch)
    return DecoderOutput(logits=predictions[unsort], alphas=alphas[unsort])


@torch.no_grad()
def beam_search(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int = 3, max_length: int = 20,
                length_penalty: float = 0.0, min_length: int = 0) -> Captions:
    """One image at a time; a finished hypothesis leaves the beam (k shrinks), as in the port.

    min_length forbids <end> before that many words (the timing mode: every search runs max_length
    steps). length_penalty is not supported by the port and is ignored.
    """
    results = [_one_image(decoder, a, beam_size=beam_size, max_length=max_length, min_length=min_length)
               for a in annotations]
    steps = max(tokens.shape[0] for tokens, _, _ in results)
    cells = annotations.shape[1]
    tokens = torch.full((len(results), steps), Vocabulary.pad_id, dtype=torch.long)
    alphas = torch.zeros(len(results), steps, cells)
    lengths, scores = torch.zeros(len(results), dtype=torch.long), torch.zeros(len(results))
    for b, (seq, seq_alpha, score) in enumerate(results):
        tokens[b, : seq.shape[0]], alphas[b, : seq.shape[0]], scores[b] = seq, seq_alpha, score
        ended = (seq == Vocabulary.end_id).nonzero()
        lengths[b] = int(ended[0]) if len(ended) else seq.shape[0]
    return Captions(tokens=tokens, alphas=alphas, lengths=lengths, scores=scores)


def _one_image(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int, max_length: int,
               min_length: int):
    k = beam_size
    encoder_out = annotations[None].expand(k, *annotations.shape)  # [k, L, D]
    mean = encoder_out.mean(dim=1)
    h, c = torch.tanh(decoder.init_h(mean)), decoder.init_c(mean)
    previous = torch.full((k,), Vocabulary.start_id, dtype=torch.long)
    seqs = torch.zeros(k, 0, dtype=torch.long)
    seqs_alpha = torch.zeros(k, 0, annotations.shape[0])
    top_scores = torch.zeros(k, 1)
    complete: list[tuple[torch.Tensor, torch.Tensor, float]] = []
    for step in range(max_length):
        embedded = decoder.embed(previous)
        logits, h, c, alpha = _step(decoder, encoder_out, h, c, embedded)
        scores = torch.log_softmax(logits, dim=1)
        if step < min_length:
            scores[:, Vocabulary.end_id] = float("-inf")
        scores = top_scores.expand_as(scores) + scores
        if step == 0:
            top, words = scores[0].topk(k, 0)
        else:
            top, words = scores.view(-1).topk(k, 0)
        parent, word = words // scores.shape[1], words % scores.shape[1]
        seqs = torch.cat([seqs[parent], word.unsqueeze(1)], dim=1)
        seqs_alpha = torch.cat([seqs_alpha[parent], alpha[parent].unsqueeze(1)], dim=1)
        open_rows = [i for i, w in enumerate(word.tolist()) if w != Vocabulary.end_id]
        for i in set(range(len(word))) - set(open_rows):
            complete.append((seqs[i], seqs_alpha[i], float(top[i])))
        k = len(open_rows)
        if k == 0:
            break
        keep = torch.tensor(open_rows)
        seqs, seqs_alpha = seqs[keep], seqs_alpha[keep]
        h, c, encoder_out = h[parent[keep]], c[parent[keep]], encoder_out[parent[keep]]
        top_scores, previous = top[keep].unsqueeze(1), word[keep]
    if not complete:  # nothing ended within max_length: the best open hypothesis
        best = int(top_scores.argmax())
        return seqs[best], seqs_alpha[best], float(top_scores[best])
    return max(complete, key=lambda item: item[2])
