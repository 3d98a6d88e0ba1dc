"""Scoring generated captions: COCO caption metrics, attention correctness and relation accuracy.

Caption metrics come from pycocoevalcap, the code behind the COCO leaderboard: one generated
caption per image against all its references. Its PTB tokenizer and METEOR run on Java; without
Java we say so and score BLEU, ROUGE-L and CIDEr on the project's own tokenization.

Attention correctness (Liu et al., 2017, "Attention Correctness in Neural Image Captioning"): for
every generated word that names an object, the share of its attention map, upsampled to the image
and normalized, that falls inside that object's box. Its chance level is the same for a uniform
map, i.e. the box's share of the image.

Relation accuracy (shapes data) is scored two ways. Over the relations the model *states*: how
many of them hold in the image; a model that is unsure of positions tends to list the objects
instead ("a red circle and a blue square"), so this counts few, self-selected relations. And by a
*probe* that asks every model the same questions: for each ordered pair of objects (A, B) of an
image, which of the four captions "a <A> <relation> a <B>" it finds most likely (teacher forcing,
the whole caption with its <end>); the probe's accuracy is how often that is the true relation
(chance: 0.25). The probe's answers split in two: whether it picks the right *axis* (left/right
against above/below: which of |dx|, |dy| is larger) and, where it does, the right *direction*
along it (the sign); a decoder can know the one and not the other (docs/attention.md). The whole
caption includes B, so a decoder can pass the probe by *checking*: having said "above a", it looks
above A and finds B there or not. The relation's words alone, the likeliest of the four after
"a <A>", are what it would *say* before naming B; relation_probe_words is how often they hold of A
and some other object of the image, against that share's chance level.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from captioning.attention import hard_inference
from captioning.data.images import attention_on_image
from captioning.data.shapes import COLOURS, RELATIONS, SHAPES, SIZES, Grounding, ShapeObject, relation
from captioning.decoder import AttentionDecoder
from captioning.decoding import decode
from captioning.vocab import Vocabulary, normalize, tokenize

JAVA_METRICS = ("METEOR", "the PTB tokenizer")


def java_available() -> bool:
    return shutil.which("java") is not None


def _quietly(function, *args):
    """pycocoevalcap prints its internals to stdout; keep our output readable."""
    with contextlib.redirect_stdout(io.StringIO()):
        return function(*args)


def caption_metrics(references: dict[int, Sequence[str]], candidates: dict[int, str], *,
                    full: bool = True) -> dict[str, float]:
    """BLEU-1..4, METEOR, ROUGE-L and CIDEr of one candidate per image against its references.

    `full=False` is the fast, Java-free subset used to pick checkpoints during training: BLEU and
    CIDEr on the project's tokenization.
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    use_java = full and java_available()
    if full and not use_java:
        print(f"warning: java not found, so {' and '.join(JAVA_METRICS)} are skipped; BLEU, ROUGE_L and CIDEr "
              "are computed on the project's own tokenization (install a Java runtime for the standard numbers)",
              file=sys.stderr)
    if use_java:
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        tokenizer = PTBTokenizer()
        # The same normalization as training targets (curly quotes, case, spaces), then the PTB tokenizer.
        gts = _quietly(tokenizer.tokenize,
                       {i: [{"caption": normalize(c)} for c in refs] for i, refs in references.items()})
        res = _quietly(tokenizer.tokenize, {i: [{"caption": candidates[i]}] for i in references})
    else:
        gts = {i: [" ".join(tokenize(c)) for c in refs] for i, refs in references.items()}
        res = {i: [" ".join(tokenize(candidates[i]))] for i in references}
    metrics: dict[str, float] = {}
    bleu, _ = _quietly(Bleu(4).compute_score, gts, res)
    metrics.update({f"Bleu_{n + 1}": float(b) for n, b in enumerate(bleu)})
    if use_java:
        from pycocoevalcap.meteor.meteor import Meteor

        metrics["METEOR"] = float(_quietly(Meteor().compute_score, gts, res)[0])
    if full:
        metrics["ROUGE_L"] = float(_quietly(Rouge().compute_score, gts, res)[0])
    metrics["CIDEr"] = float(_quietly(Cider().compute_score, gts, res)[0])
    return metrics


_PHRASE = rf"(?:({'|'.join(SIZES)}) )?({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})"
_RELATION = re.compile(rf"{_PHRASE} ({'|'.join(RELATIONS)}) a {_PHRASE}")


def _find(objects: Sequence[ShapeObject], shape: str, colour: str | None) -> int | None:
    """The object a phrase names: by shape and colour, or by shape alone if that is unambiguous."""
    matches = [i for i, o in enumerate(objects) if o.shape == shape and (colour is None or o.colour == colour)]
    if not matches and colour is not None:
        return _find(objects, shape, None)
    return matches[0] if len(matches) == 1 else None


def word_objects(words: Sequence[str], objects: Sequence[ShapeObject]) -> list[tuple[int, int]]:
    """(word index, object index) for each generated shape noun that names an object in the image."""
    links = []
    for position, word in enumerate(words):
        if word in SHAPES:
            colour = words[position - 1] if position > 0 and words[position - 1] in COLOURS else None
            target = _find(objects, word, colour)
            if target is not None:
                links.append((position, target))
    return links


def box_mass(alpha: np.ndarray, box: Sequence[float], *, width: int, height: int) -> float:
    """Share of an attention map [Hg, Wg], drawn on a width x height image, inside box (x0, y0, x1, y1)."""
    heat = attention_on_image(alpha, width=width, height=height)  # [height, width]
    heat = np.clip(heat, 0, None)
    x0, y0, x1, y1 = box
    ys, xs = np.mgrid[0:height, 0:width] + 0.5  # pixel centres
    inside = (xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)
    return float(heat[inside].sum() / heat.sum())


def box_share(box: Sequence[float], *, width: int, height: int) -> float:
    """The chance level: what a uniform map puts inside the box (the crop is the whole square image)."""
    return box_mass(np.ones((1, 1)), box, width=width, height=height)


# What a stated relation "A <relation> B" is, scored against the image: true; wrong (A and B are two
# of its objects, and another relation holds); self (B names A again: "a red circle above a red
# circle"); absent (A or B names no object of the image, or more than one).
VERDICTS = ("true", "wrong", "self", "absent")


def grounding_scores(words: Sequence[str], alphas: np.ndarray,
                     truth: Grounding) -> tuple[list[float], list[float], list[str]]:
    """Per named word: attention mass in its box and the chance level; per stated relation: its
    verdict (VERDICTS).

    words: generated words; alphas [n_words, Hg, Wg], the map that generated each word.
    """
    correct, chance = [], []
    for position, target in word_objects(words, truth.objects):
        box = truth.objects[target].box
        correct.append(box_mass(alphas[position], box, width=truth.width, height=truth.height))
        chance.append(box_share(box, width=truth.width, height=truth.height))
    relations = []
    for match in _RELATION.finditer(" ".join(words)):
        _, colour_a, shape_a, stated, _, colour_b, shape_b = match.groups()
        a, b = _find(truth.objects, shape_a, colour_a), _find(truth.objects, shape_b, colour_b)
        if a is None or b is None:
            relations.append("absent")
        elif a == b:  # relation(A, A) would read "to the right of": no offset on either axis
            relations.append("self")
        else:
            relations.append("true" if relation(truth.objects[a], truth.objects[b]) == stated else "wrong")
    return correct, chance, relations


@torch.no_grad()
def caption_log_likelihoods(decoder: AttentionDecoder, annotations: torch.Tensor,
                            captions: Sequence[Sequence[int]]) -> torch.Tensor:
    """log p(caption | image) of token ids [<start> w1 .. wn <end>] under teacher forcing; annotations
    [N, L, D], one row per caption. Returns [N]."""
    return caption_token_log_likelihoods(decoder, annotations, captions).sum(dim=1)


def caption_token_log_likelihoods(decoder: AttentionDecoder, annotations: torch.Tensor,
                                  captions: Sequence[Sequence[int]]) -> torch.Tensor:
    """log p(w_k | w_<k, image) of each predicted token w1 .. <end>, 0 past a caption's end: [N, T]."""
    lengths = torch.tensor([len(c) - 1 for c in captions])  # predicted tokens: w1 .. <end>
    tokens = torch.full((len(captions), int(lengths.max()) + 1), Vocabulary.pad_id, dtype=torch.long)
    for row, caption in enumerate(captions):
        tokens[row, : len(caption)] = torch.tensor(caption)
    tokens = tokens.to(annotations.device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # [N, T]
    logits = decoder(annotations, inputs, lengths=lengths.to(annotations.device)).logits.float()  # [N, T, V]
    picked = torch.log_softmax(logits, dim=2).gather(2, targets[:, :, None]).squeeze(2)  # [N, T]
    return picked * (targets != Vocabulary.pad_id)  # [N, T]


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


def relation_probe(decoder: AttentionDecoder, annotations: torch.Tensor, truths: Sequence[Grounding],
                   vocab: Vocabulary) -> list[ProbeAnswer]:
    """For every ordered pair of objects (A, B) of each image, scores the four captions
    "a <colour A> <shape A> <relation> a <colour B> <shape B>" by their likelihood: the whole caption
    and, separately, the relation's own words. annotations [B, L, D], one row per image of `truths`."""
    rows, captions, pairs = [], [], []
    for image, grounding in enumerate(truths):
        objects = grounding.objects
        for a, b in ((a, b) for a in range(len(objects)) for b in range(len(objects)) if a != b):
            first, second = objects[a], objects[b]
            for stated in RELATIONS:
                words = ["a", first.colour, first.shape, *stated.split(), "a", second.colour, second.shape]
                captions.append(vocab.encode(words))
                rows.append(image)
            holding = frozenset(RELATIONS.index(relation(first, other)) for other in objects if other is not first)
            pairs.append((RELATIONS.index(relation(first, second)), holding))
    if not pairs:
        return []
    tokens = caption_token_log_likelihoods(decoder, annotations[torch.tensor(rows, device=annotations.device)],
                                           captions).cpu()  # [pairs * 4, T]
    whole = tokens.sum(dim=1).view(len(pairs), len(RELATIONS))  # [pairs, 4]
    # The relation's words are predicted tokens 3 .. 3 + n - 1 (after "a", colour, shape).
    spans = [(3, 3 + len(stated.split())) for stated in RELATIONS]
    own = torch.stack([tokens[k::len(RELATIONS), start:end].sum(dim=1) for k, (start, end) in enumerate(spans)],
                      dim=1)  # [pairs, 4]
    return [ProbeAnswer(truth, int(picked), int(words), holding)
            for (truth, holding), picked, words in zip(pairs, whole.argmax(dim=1), own.argmax(dim=1))]


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


@torch.no_grad()
def evaluate_split(decoder: AttentionDecoder, annotations: np.ndarray, *, image_ids: Sequence[int],
                   references: Sequence[Sequence[str]], vocab: Vocabulary, grid: tuple[int, int],
                   grounding: Sequence[Grounding] | None = None, beam_size: int = 1, max_length: int = 20,
                   length_penalty: float = 0.0, batch_size: int = 100, full: bool = True,
                   device: str | torch.device = "cpu",
                   hard_attention: str | None = None, probe: bool = True) -> tuple[dict[str, float], list[dict]]:
    """Decode every image of a split and score it. annotations [N, L, D]. `hard_attention` is how a
    hard attention model picks its cell (see decoding); attention correctness scores the map alpha.
    With grounding, also the relation probe unless `probe` is False (it does not depend on the
    decoding, so a second decoding of the same split need not run it again).

    Returns the metrics and the COCO results list [{"image_id", "caption"}].
    """
    decoder.eval()
    results, correct, chance, relations, probed = [], [], [], [], []
    for start in range(0, len(image_ids), batch_size):
        batch = torch.from_numpy(np.asarray(annotations[start:start + batch_size], dtype=np.float32)).to(device)
        captions = decode(decoder, batch, beam_size=beam_size, max_length=max_length, length_penalty=length_penalty,
                          hard_attention=hard_attention)
        for row in range(batch.shape[0]):
            index = start + row
            words = vocab.decode(captions.tokens[row].tolist())
            results.append({"image_id": int(image_ids[index]), "caption": " ".join(words)})
            if grounding is not None:
                alphas = captions.alphas[row, : len(words)].view(len(words), *grid).float().cpu().numpy()
                c, h, r = grounding_scores(words, alphas, grounding[index])
                correct += c
                chance += h
                relations += r
        if grounding is not None and probe:
            with hard_inference(decoder, hard_attention):
                probed += relation_probe(decoder, batch, grounding[start:start + batch.shape[0]], vocab)
    metrics = caption_metrics({i: refs for i, refs in zip(image_ids, references)},
                              {r["image_id"]: r["caption"] for r in results}, full=full)
    if grounding is not None:
        metrics["attention_correctness"] = float(np.mean(correct)) if correct else float("nan")
        metrics["attention_correctness_chance"] = float(np.mean(chance)) if chance else float("nan")
        metrics["attention_words"] = len(correct)
        metrics["relation_accuracy"] = float(np.mean([v == "true" for v in relations])) if relations else float("nan")
        metrics["relations_generated"] = len(relations)
        metrics.update({f"relations_{verdict}": relations.count(verdict) for verdict in VERDICTS[1:]})
        if probe:
            metrics.update(probe_scores(probed))
    return metrics, results
