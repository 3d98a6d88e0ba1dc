"""The relation probe (shapes data): does the decoder know where things are, asked the same way of
every model?

For each ordered pair of objects (A, B) of an image, the probe scores the four captions
"a <colour A> <shape A> <relation> a <colour B> <shape B>" by their likelihood under teacher forcing
(the whole caption with its <end>), and takes the likeliest; its accuracy is how often that is the
true relation (chance: 0.25). The answers split in two: whether the right *axis* is picked
(left/right against above/below: which of |dx|, |dy| is larger) and, where it is, the right
*direction* along it (the sign); a decoder can know the one and not the other (studies/relations).
The whole caption includes B, so a decoder can pass the probe by *checking*: having said "above a",
it looks above A and finds B there or not. The relation's words alone, the likeliest of the four
after "a <A>", are what it would *say* before naming B; relation_probe_words is how often they hold
of A and some other object of the image, against that share's chance level.

The captions share their beginnings, so they are scored as a tree, each shared part once: "<start>
a <A>" once per image and first object, each relation's words (and the "a" after them) once per
first object, and only "<colour B> <shape B> <end>" once per pair and relation. That is about half
the decoder steps of scoring the captions one by one, and the attention keys are computed once per
image; the log-likelihoods are the same (tests/eval/shapes/test_probe.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from captioning.data.shapes.scenes import RELATIONS, SceneObjects, relation
from captioning.data.vocab import Vocabulary
from captioning.model.paper import AttentionDecoder, Memory
from captioning.model.state import DecoderState

Phrase = tuple[str, str]  # (colour, shape): how a caption names an object


@dataclass(frozen=True)
class ProbeAnswer:
    """The relation probe's answer for one ordered pair of objects (A, B), as indices into RELATIONS."""

    truth: int  # the relation that holds of A with respect to B
    picked: int  # the relation of the likeliest whole caption "a A <relation> a B"
    # The relation whose words alone are likeliest after "a A", i.e. what the decoder would say
    # before it has named B, and the relations that hold of A and *some* other object: that choice
    # is right if it is one of them (the caption may go on to name that other object).
    words: int
    holding: frozenset[int]


def _teacher_forced(decoder: AttentionDecoder, memory: Memory, state: DecoderState, tokens: torch.Tensor, *,
                    feed_last: bool) -> tuple[torch.Tensor, torch.Tensor | None, DecoderState]:
    """Feeds tokens [N, k] from `state`: log p of tokens 1 .. k-1 given those before, [N, k - 1]; with
    feed_last, also the last token, and the log-distribution of the word after it, [N, V]."""
    picked, log_probs = [], None
    for position in range(tokens.shape[1] - (0 if feed_last else 1)):
        logits, state, _ = decoder.next_word(memory, state, tokens[:, position])
        log_probs = torch.log_softmax(logits.float(), dim=1)  # [N, V]
        if position + 1 < tokens.shape[1]:
            picked.append(log_probs.gather(1, tokens[:, position + 1, None]).squeeze(1))
    scored = torch.stack(picked, dim=1) if picked else tokens.new_zeros((tokens.shape[0], 0), dtype=torch.float)
    return scored, (log_probs if feed_last else None), state


@torch.no_grad()
def relation_log_likelihoods(decoder: AttentionDecoder, annotations: torch.Tensor,
                             pairs: Sequence[tuple[int, Phrase, Phrase]],
                             vocab: Vocabulary) -> tuple[torch.Tensor, torch.Tensor]:
    """For each (image, A, B) of `pairs`, with the image a row of annotations [B, L, D]: log p of the
    four whole captions "a A <relation> a B" [P, 4], and of the relation's own words after "a A" [P, 4],
    in the order of RELATIONS."""
    device = annotations.device
    memory, state = decoder.start(annotations)  # the keys once per image

    def ids(rows: Sequence[Sequence[str]]) -> torch.Tensor:
        return torch.tensor([vocab.encode(row)[1:-1] for row in rows], device=device)  # [N, words]

    # "<start> a <A>", once per image and first object; then the distribution of the relation's first word.
    firsts = sorted({(image, a) for image, a, _ in pairs})
    first_of = {first: row for row, first in enumerate(firsts)}
    images = torch.tensor([image for image, _ in firsts], device=device)  # [F]
    memory, state = memory.select(images), state.select(images)
    start = torch.full((len(firsts), 1), vocab.start_id, device=device)
    prefix, after_a, state = _teacher_forced(decoder, memory, state,
                                             torch.cat([start, ids([("a", *a) for _, a in firsts])], dim=1),
                                             feed_last=True)  # [F, 3], [F, V]
    # Each relation's words and the "a" after them, once per first object; then the distribution of B's colour.
    own, through_a, after_relation, states = [], [], [], []
    for stated in RELATIONS:
        words = ids([[*stated.split(), "a"]] * len(firsts))  # [F, n + 1]
        scored, log_probs, relation_state = _teacher_forced(decoder, memory, state, words, feed_last=True)
        first_word = after_a.gather(1, words[:, :1]).squeeze(1)  # [F]
        own.append(first_word + scored[:, :-1].sum(dim=1))  # the relation's n words
        through_a.append(prefix.sum(dim=1) + first_word + scored.sum(dim=1))  # "a A <relation> a"
        after_relation.append(log_probs)
        states.append(relation_state)
    # "<colour B> <shape B> <end>" once per pair and relation: rows r * F + first, relation-major.
    rows = torch.tensor([k * len(firsts) + first_of[(image, a)] for k in range(len(RELATIONS))
                         for image, a, _ in pairs], device=device)  # [4P]
    state = DecoderState.cat(states).select(rows)
    memory = memory.select(rows % len(firsts))
    ends = torch.full((len(rows), 1), vocab.end_id, device=device)
    second = torch.cat([ids([b for _, _, b in pairs])] * len(RELATIONS))  # [4P, 2]
    rest, _, _ = _teacher_forced(decoder, memory, state, torch.cat([second, ends], dim=1), feed_last=False)
    colour = torch.cat(after_relation).index_select(0, rows).gather(1, second[:, :1]).squeeze(1)  # [4P]
    whole = torch.cat(through_a).index_select(0, rows) + colour + rest.sum(dim=1)  # [4P]
    own_words = torch.cat(own).index_select(0, rows)  # [4P]
    return (whole.view(len(RELATIONS), len(pairs)).T.cpu(),
            own_words.view(len(RELATIONS), len(pairs)).T.cpu())  # [P, 4] each


def relation_probe(decoder: AttentionDecoder, annotations: torch.Tensor, truths: Sequence[SceneObjects],
                   vocab: Vocabulary) -> list[ProbeAnswer]:
    """The probe's answer for every ordered pair of objects (A, B) of each image, image by image, A
    then B. annotations [B, L, D], one row per image of `truths`."""
    pairs, answers = [], []
    for image, scenes in enumerate(truths):
        objects = scenes.objects
        for a, b in ((a, b) for a in range(len(objects)) for b in range(len(objects)) if a != b):
            first, second = objects[a], objects[b]
            pairs.append((image, (first.colour, first.shape), (second.colour, second.shape)))
            holding = frozenset(RELATIONS.index(relation(first, other)) for other in objects if other is not first)
            answers.append((RELATIONS.index(relation(first, second)), holding))
    if not pairs:
        return []
    whole, own = relation_log_likelihoods(decoder, annotations, pairs, vocab)  # [P, 4] each
    return [ProbeAnswer(truth, int(picked), int(words), holding)
            for (truth, holding), picked, words in zip(answers, whole.argmax(dim=1), own.argmax(dim=1))]


def probe_scores(answers: Sequence[ProbeAnswer]) -> dict[str, float]:
    """The probe's accuracy, and its two parts: the right axis (horizontal or vertical), and the
    right direction where the axis is right. Also the relation words alone (relation_probe_words):
    how often what the decoder would say before naming B holds of A and some other object, with
    its chance level (the share of the four relations that hold)."""
    if not answers:
        return {"relation_probe_accuracy": float("nan"), "relation_probe_axis": float("nan"),
                "relation_probe_direction": float("nan"), "relation_probe_words": float("nan"),
                "relation_probe_words_chance": float("nan"), "relation_probe_pairs": 0}
    truth, picked = np.array([(a.truth, a.picked) for a in answers]).T
    horizontal = np.array(["left" in r or "right" in r for r in RELATIONS])  # [4], per relation
    axis = horizontal[truth] == horizontal[picked]
    return {"relation_probe_accuracy": float(np.mean(truth == picked)), "relation_probe_axis": float(np.mean(axis)),
            "relation_probe_direction": float(np.mean(truth[axis] == picked[axis])) if axis.any() else float("nan"),
            "relation_probe_words": float(np.mean([a.words in a.holding for a in answers])),
            "relation_probe_words_chance": float(np.mean([len(a.holding) / len(RELATIONS) for a in answers])),
            "relation_probe_pairs": len(answers)}
