"""Caption generation: greedy decoding and batched beam search, both returning attention maps.

Notation: B images, K beams (or samples), N = B*K rows, T steps, L grid cells, V vocabulary size.

Greedy decoding and self-critical training's sampling (captioning.train.scst) are one loop, `unroll`,
that picks each row's next word from its log-probabilities (the most likely one, or a sample).

Beam search runs all images and all beams as one [B*K] batch: one decoder step per word for the
whole batch, never a loop over images; the image-side work is done once per image, not per beam.

Hard attention picks its cell at test time by `hard_choice`: "expectation" (the paper's default),
"argmax" or "sample"; the chosen cells come back in `locations`.

Neither search emits a token no caption contains (<pad>, <start>), nor <unk> unless `allow_unk`: a
caption that says "<unk>" tells the reader nothing (it stands for the rare words that
data.min_word_count dropped). `no_repeat_ngram` = n > 0 forbids a row to say any n words it has
said before in that order (the repetition block common in captioning and translation toolkits; not
in the paper). Both only narrow the search: the words left keep the model's own log-probabilities
(no renormalization), so a caption's score is what the model gives it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from captioning.model.attention import choosing
from captioning.model.ensemble import Ensemble, EnsembleState, mean_log_probs
from captioning.model.paper import AttentionDecoder, Draws
from captioning.model.state import DecoderState
from captioning.model.tokens import END_ID, PAD_ID, START_ID, UNK_ID


@dataclass
class StepOutput:
    """One word's step for N rows."""

    logits: torch.Tensor  # [N, V]
    state: DecoderState
    alpha: torch.Tensor  # [N, L]
    location: torch.Tensor  # [N] long: hard attention's chosen cell, -1 where none was chosen
    cell_log_prob: torch.Tensor | None = None  # [N], hard attention's log alpha_t[s_t] (0 for the expectation)
    # [N, t]: self-attention over the words said so far (model.extras.word_attention), the weight of
    # <start> and of each earlier word for this one; None without it
    word_alphas: torch.Tensor | None = None


# One decoding step: (state, previous tokens [N]) -> StepOutput.
Step = Callable[[DecoderState, torch.Tensor], StepOutput]


@dataclass
class Captions:
    tokens: torch.Tensor  # [B, T] generated ids, <end> included where emitted, then <pad>
    alphas: torch.Tensor  # [B, T, L]; alphas[b, t] is the map used to generate tokens[b, t]
    lengths: torch.Tensor  # [B] words before <end>
    scores: torch.Tensor  # [B] summed log-probabilities (before any length normalization)
    locations: torch.Tensor | None = None  # [B, T] hard attention's chosen cell per word, -1 for the expectation
    # [B, T, T] with model.extras.word_attention: word_alphas[b, t, j] is the weight word t gave to
    # <start> (j = 0) and to word j (1 <= j <= t) of its own caption, 0 for later words; else None
    word_alphas: torch.Tensor | None = None


def _lengths(tokens: torch.Tensor, end_id: int) -> torch.Tensor:
    """Words before the first <end> (all of them if none). tokens [..., T] -> [...]."""
    is_end = tokens == end_id
    first = torch.where(is_end.any(-1), is_end.float().argmax(-1), torch.full_like(tokens[..., 0], tokens.shape[-1]))
    return first


_never: dict[tuple[str, bool], torch.Tensor] = {}  # never_said's, per device: copied there once a process


def never_said(*, allow_unk: bool, device: torch.device | str) -> torch.Tensor:
    """The ids no caption of a search may contain [k]: <pad>, <start>, and <unk> unless allowed. Made
    on a device once, not at every search: a copy from the host is a wait, and a CUDA graph cannot
    hold one."""
    key = (str(device), allow_unk)
    if key not in _never:
        _never[key] = torch.tensor([PAD_ID, START_ID] + ([] if allow_unk else [UNK_ID]), device=device)
    return _never[key]


def repeated_ngrams(history: torch.Tensor, n: int, vocab_size: int) -> torch.Tensor:
    """Which next words would repeat an n-gram: history [N, t] (the words said so far) -> [N, V] bool,
    True where the last n - 1 words followed by that word already occur in the row's history."""
    rows, said = history.shape
    banned = torch.zeros(rows, vocab_size, dtype=torch.uint8, device=history.device)
    if n <= 0 or said < n:  # (with n - 1 words said, no whole n-gram lies behind yet)
        return banned.bool()
    grams = history.unfold(1, n, 1)  # [N, t - n + 1, n], every n-gram said
    tail = history[:, said - n + 1:]  # [N, n - 1], the words the next one continues
    same = (grams[:, :, :n - 1] == tail[:, None, :]).all(dim=2)  # [N, t - n + 1]
    # A word is banned where any earlier n-gram with the same first n - 1 words ends in it.
    return banned.scatter_reduce_(1, grams[:, :, n - 1], same.to(torch.uint8), reduce="amax").bool()


def stepper(decoder: AttentionDecoder, annotations: torch.Tensor, group: int, *, draws: Draws | None = None,
            differentiable: bool = False) -> tuple[Step, DecoderState]:
    """One decoding step for `group` rows per image (beams, or samples), and the initial state [B*group, H].

    The image-side work (keys, h_0, c_0) is done once per image. A decoder with an accelerator (soft
    attention with the additive score: captioning.model.fused.GroupedStep) shares each image's memory
    among its rows, unless the step must keep its graph (`differentiable`: self-critical training);
    any other gets the memory rows repeated once per row. `draws`: hard attention's randomness while training
    (its chance of the expectation; each image's coin is flipped before its rows are made, so they
    share it). Soft attention chooses no cell: its locations are -1.
    """
    if isinstance(decoder, Ensemble):
        return _joined([stepper(member, own, group, draws=draws, differentiable=differentiable)
                        for member, own in zip(decoder.members, decoder.annotations(annotations))])
    memory, state = decoder.start(annotations, draws=draws)
    rows = torch.arange(annotations.shape[0], device=annotations.device).repeat_interleave(group)  # [B*group]
    state = state.select(rows)
    none = torch.full((rows.shape[0],), -1, dtype=torch.long, device=annotations.device)  # [B*group]
    if decoder.accelerator is not None and not differentiable:
        grouped = decoder.accelerator.grouped_step(decoder, memory, group=group, like=annotations)

        def step(state: DecoderState, tokens: torch.Tensor) -> StepOutput:
            logits, h, c, alpha = grouped(state.h, state.c, tokens)
            return StepOutput(logits, DecoderState(h, c), alpha, none)
    else:
        repeated = memory.select(rows) if group > 1 else memory

        def step(state: DecoderState, tokens: torch.Tensor) -> StepOutput:
            logits, state, attended = decoder.next_word(repeated, state, tokens)
            location = attended.location if attended.location is not None else none
            return StepOutput(logits, state, attended.alpha, location, attended.log_prob, state.word_alphas)
    return step, state


def _joined(parts: list[tuple[Step, DecoderState]]) -> tuple[Step, EnsembleState]:
    """An ensemble's step from its members' (captioning.model.ensemble): the mean of their word
    probabilities, as log-probabilities (a softmax of them gives them back), and of their maps; the
    first member's cells."""
    steps = [step for step, _ in parts]

    def step(state: EnsembleState, tokens: torch.Tensor) -> StepOutput:
        outs = [member(own, tokens) for member, own in zip(steps, state.members)]
        return StepOutput(mean_log_probs([out.logits for out in outs]), EnsembleState([out.state for out in outs]),
                          torch.stack([out.alpha for out in outs]).mean(0), outs[0].location)

    return step, EnsembleState([state for _, state in parts])


@dataclass
class Unrolled:
    """What `unroll` generated for N rows."""

    tokens: torch.Tensor  # [N, T], <end> included where emitted, then <pad>
    log_probs: torch.Tensor  # [N, T], each word's log-probability (with the graph, if the step kept one); 0 after <end>
    alphas: torch.Tensor  # [N, T, L]
    locations: torch.Tensor  # [N, T], -1 where no cell was chosen
    cell_log_probs: torch.Tensor | None  # [N, T], hard attention's log alpha_t[s_t], 0 after <end>; None for soft
    word_alphas: torch.Tensor | None = None  # [N, T, T], as Captions.word_alphas


def unroll(step: Step, state: DecoderState, *, max_length: int, pick: Callable[[torch.Tensor], torch.Tensor],
           never: torch.Tensor | None = None, blocked: torch.Tensor | None = None,
           no_repeat_ngram: int = 0) -> Unrolled:
    """The autoregressive loop: from <start>, each row's next word is `pick(log_probs [N, V])` [N],
    until every row has emitted <end> or `max_length` words. Rows that have ended take <pad> at no cost.

    `never` [k]: token ids no row may pick, their probability 0 before the softmax (self-critical
    sampling draws from the rest, renormalized: no caption contains <pad> or <start>). `blocked` [k]
    and `no_repeat_ngram` > 0 (a word that would repeat an n-gram of the row's own) narrow a search
    instead: masked after the softmax, so the words left keep the model's log-probabilities."""
    rows, device = state.h.shape[0], state.h.device
    previous = torch.full((rows,), START_ID, dtype=torch.long, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    tokens, log_probs, alphas, locations, cells, words = [], [], [], [], [], []
    for _ in range(max_length):
        out = step(state, previous)
        state, logits = out.state, out.logits.float()
        if never is not None:
            logits = logits.index_fill(1, never, float("-inf"))
        log_p = torch.log_softmax(logits, dim=1)  # [N, V]
        if blocked is not None:
            log_p = log_p.index_fill(1, blocked, float("-inf"))
        if no_repeat_ngram > 0 and tokens:
            log_p = log_p.masked_fill(repeated_ngrams(torch.stack(tokens, 1), no_repeat_ngram, log_p.shape[1]),
                                      float("-inf"))
        word = pick(log_p).masked_fill(finished, PAD_ID)  # [N]
        log_probs.append(log_p.gather(1, word[:, None])[:, 0].masked_fill(finished, 0.0))
        if out.cell_log_prob is not None:
            cells.append(out.cell_log_prob.float().masked_fill(finished, 0.0))
        tokens.append(word)
        alphas.append(out.alpha)
        locations.append(out.location)
        if out.word_alphas is not None:
            words.append(out.word_alphas)
        finished = finished | (word == END_ID)
        previous = word
        if finished.all():
            break
    return Unrolled(tokens=torch.stack(tokens, 1), log_probs=torch.stack(log_probs, 1), alphas=torch.stack(alphas, 1),
                    locations=torch.stack(locations, 1), cell_log_probs=torch.stack(cells, 1) if cells else None,
                    word_alphas=_word_alphas(words))


def _word_alphas(steps: list[torch.Tensor]) -> torch.Tensor | None:
    """Each step's weights over the words before it, [N, t + 1] at step t, as one [N, T, T]."""
    if not steps:
        return None
    square = steps[0].new_zeros(steps[0].shape[0], len(steps), len(steps))  # [N, T, T]
    for t, weights in enumerate(steps):
        square[:, t, :weights.shape[1]] = weights
    return square


def most_likely(log_probs: torch.Tensor) -> torch.Tensor:
    """Greedy decoding's pick: each row's most likely word [N]."""
    return log_probs.max(dim=1).indices


@torch.no_grad()
def greedy(decoder: AttentionDecoder, annotations: torch.Tensor, *, max_length: int = 20, no_repeat_ngram: int = 0,
           allow_unk: bool = False) -> Captions:
    """The most likely word at every step (of those the module docstring lets a caption say).
    annotations [B, L, D]."""
    step, state = stepper(decoder, annotations, 1)
    out = unroll(step, state, max_length=max_length, pick=most_likely,
                 blocked=never_said(allow_unk=allow_unk, device=annotations.device), no_repeat_ngram=no_repeat_ngram)
    return Captions(tokens=out.tokens, alphas=out.alphas, lengths=_lengths(out.tokens, END_ID),
                    scores=out.log_probs.sum(1), locations=out.locations, word_alphas=out.word_alphas)


@torch.no_grad()
def beam_search(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int = 3, max_length: int = 20,
                length_penalty: float = 0.0, min_length: int = 0, no_repeat_ngram: int = 0,
                allow_unk: bool = False) -> Captions:
    """Batched beam search. annotations [B, L, D].

    A finished beam stays in the beam with a frozen score (it can only continue with <pad> at no
    cost) and competes with the open ones on that score: K open beams that outscore it push it
    out, though they may end below it (the finished are not kept in a pool of their own). What
    this drops is mostly the empty caption, <end> as the first word, whose raw score can beat any
    sentence's. With length_penalty alpha > 0 the final choice ranks beams by score / n**alpha, n
    the tokens its score sums (its words, and <end> where it emitted one: words + 1 for a finished
    beam); a beam that never emitted <end> is still a candidate, so every image gets a caption.
    min_length forbids <end> before that many words (with min_length = max_length every search runs
    exactly max_length steps, which timing needs).

    Each step writes its words, back-pointers, maps and cells into buffers preallocated for
    max_length steps; the chosen hypothesis is read back through the back-pointers once, at the end,
    instead of reordering and growing every beam's history at every step.
    """
    batch, cells = annotations.shape[0], annotations.shape[1]
    device = annotations.device
    step, state = stepper(decoder, annotations, beam_size)
    scores = torch.full((batch, beam_size), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    previous = torch.full((batch * beam_size,), START_ID, dtype=torch.long, device=device)
    finished = torch.zeros(batch, beam_size, dtype=torch.bool, device=device)
    words = torch.zeros(max_length, batch, beam_size, dtype=torch.long, device=device)  # [T, B, K]
    parents = torch.zeros(max_length, batch, beam_size, dtype=torch.long, device=device)  # [T, B, K]
    maps = torch.zeros(max_length, batch, beam_size, cells, device=device)  # [T, B, K, L], before reordering
    chosen_cells = torch.zeros(max_length, batch, beam_size, dtype=torch.long, device=device)  # [T, B, K]
    step_word_alphas = None  # [T, B, K, T] with word self-attention: each step's weights over the words before it
    offsets = torch.arange(batch, device=device)[:, None] * beam_size  # [B, 1]
    frozen = None
    never = never_said(allow_unk=allow_unk, device=device)
    said = torch.empty(batch * beam_size, 0, dtype=torch.long, device=device)  # [B*K, t], for the n-gram block
    steps = 0
    for steps in range(1, max_length + 1):
        out = step(state, previous)
        state, alpha, location = out.state, out.alpha, out.location
        log_probs = torch.log_softmax(out.logits.float(), dim=1).index_fill(1, never, float("-inf"))  # [B*K, V]
        if no_repeat_ngram > 0:
            log_probs = log_probs.masked_fill(repeated_ngrams(said, no_repeat_ngram, log_probs.shape[1]),
                                              float("-inf"))
        log_probs = log_probs.view(batch, beam_size, -1)  # [B, K, V]
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
        if out.word_alphas is not None:  # [B*K, steps], from the rows before they were reordered, as the maps
            if step_word_alphas is None:
                step_word_alphas = torch.zeros(max_length, batch, beam_size, max_length, device=device)
            step_word_alphas[steps - 1, :, :, :steps] = out.word_alphas.view(batch, beam_size, steps)
        finished = finished.gather(1, parent) | (word == END_ID)
        previous = word.view(-1)
        if no_repeat_ngram > 0:
            said = torch.cat([said[(offsets + parent).view(-1)], previous[:, None]], dim=1)
        if steps > min_length and finished.all():  # (no beam can have ended before: no trip to the host)
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
    word_alphas = None if step_word_alphas is None else torch.empty(batch, steps, steps, device=device)  # [B, T, T]
    beam = choice[:, None]  # [B, 1]
    for t in reversed(range(steps)):
        source = parents[t].gather(1, beam)[:, 0]  # [B], the row that generated word t of the chosen hypothesis
        chosen[:, t] = maps[t][pick, source]
        locations[:, t] = chosen_cells[t][pick, source]
        if word_alphas is not None:
            word_alphas[:, t] = step_word_alphas[t][pick, source, :steps]
        beam = source[:, None]
    return Captions(tokens=history[pick, choice], alphas=chosen, lengths=lengths[pick, choice],
                    scores=scores[pick, choice], locations=locations, word_alphas=word_alphas)


def decode(decoder: AttentionDecoder, annotations: torch.Tensor, *, beam_size: int = 1, max_length: int = 20,
           length_penalty: float = 0.0, no_repeat_ngram: int = 0, allow_unk: bool = False,
           hard_choice: str | None = None) -> Captions:
    """Greedy for beam size 1, beam search otherwise; `hard_choice`, `no_repeat_ngram` and
    `allow_unk` as in the module docstring (hard_choice None keeps the model's own choice)."""
    with choosing(decoder, hard_choice):
        if beam_size <= 1:
            return greedy(decoder, annotations, max_length=max_length, no_repeat_ngram=no_repeat_ngram,
                          allow_unk=allow_unk)
        return beam_search(decoder, annotations, beam_size=beam_size, max_length=max_length,
                           length_penalty=length_penalty, no_repeat_ngram=no_repeat_ngram, allow_unk=allow_unk)
