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
instead ("a red circle and a blue square"), so this counts few, self-selected relations. And by the
relation probe (captioning.probe), which asks every model the same questions.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import sys
from collections.abc import Sequence

import numpy as np
import torch

from captioning.data.images import attention_on_image
from captioning.data.shapes import COLOURS, RELATIONS, SHAPES, SIZES, Grounding, ShapeObject, relation
from captioning.data.vocab import Vocabulary, normalize, tokenize
from captioning.model.attention import choosing
from captioning.model.decoder import AttentionDecoder
from captioning.model.decoding import decode
from captioning.probe import probe_scores, relation_probe

JAVA_METRICS = ("METEOR", "the PTB tokenizer")
# What validation during training scores (caption_metrics with full=False), and what the shapes
# data adds that can pick a checkpoint (higher is better).
VALIDATION_CAPTION_METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr")
GROUNDING_METRICS = ("attention_correctness", "relation_accuracy", "relation_probe_accuracy", "relation_probe_axis",
                     "relation_probe_direction", "relation_probe_words")


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
    relations = [relation_verdict(a, stated, b, truth.objects)
                 for a, stated, b in stated_relations(words, truth.objects)]
    return correct, chance, relations


def relation_verdict(a: int | None, stated: str, b: int | None, objects: Sequence[ShapeObject]) -> str:
    """The verdict (VERDICTS) on "A <stated> B", A and B as stated_relations finds them."""
    if a is None or b is None:
        return "absent"
    if a == b:  # relation(A, A) would read "to the right of": no offset on either axis
        return "self"
    return "true" if relation(objects[a], objects[b]) == stated else "wrong"


def stated_relations(words: Sequence[str],
                     objects: Sequence[ShapeObject]) -> list[tuple[int | None, str, int | None]]:
    """(A's object index, relation, B's object index) per "a A <relation> a B" in the words; an index
    is None where its phrase names no object of the image, or more than one."""
    found = []
    for match in _RELATION.finditer(" ".join(words)):
        _, colour_a, shape_a, stated, _, colour_b, shape_b = match.groups()
        found.append((_find(objects, shape_a, colour_a), stated, _find(objects, shape_b, colour_b)))
    return found


@torch.no_grad()
def evaluate_split(decoder: AttentionDecoder, annotations: np.ndarray, *, image_ids: Sequence[int],
                   references: Sequence[Sequence[str]], vocab: Vocabulary, grid: tuple[int, int],
                   grounding: Sequence[Grounding] | None = None, beam_size: int = 1, max_length: int = 20,
                   length_penalty: float = 0.0, batch_size: int = 100, full: bool = True,
                   device: str | torch.device = "cpu",
                   hard_choice: str | None = None, probe: bool = True) -> tuple[dict[str, float], list[dict]]:
    """Decode every image of a split and score it. annotations [N, L, D]. `hard_choice` is how a
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
                          hard_choice=hard_choice)
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
            with choosing(decoder, hard_choice):
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
