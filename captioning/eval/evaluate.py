"""Evaluation: decode every image of a split and score the captions.

Notation: N images, L grid cells, D channels, (Hg, Wg) the grid.

The caption metrics (captioning.eval.metrics) apply to every dataset. A dataset that knows more of
its images adds its own scores through `scorer` (`scorer_for` below picks it: the shapes data's
captioning.eval.shapes.scorer, COCO's captioning.eval.coco.scorer), called once per caption with its
per-word maps and once per batch of images. `caption_diagnostics`, below too, says what went wrong
beside how much.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from captioning import progress
from captioning.checkpoint import Trained, load_ensemble
from captioning.config import Config
from captioning.config.choices import ENGLISH
from captioning.data.records import DatasetError, too_many_unreadable
from captioning.data.splits import Split
from captioning.data.vocab import Vocabulary, tokenize
from captioning.eval.coco.scorer import CocoScorer
from captioning.eval.metrics import OWN_TOKENIZER, caption_metrics, metrics_tokenizer
from captioning.eval.shapes.scorer import ShapesScorer
from captioning.model.attention import choosing, refuse_hard_choice
from captioning.model.decoding import decode
from captioning.model.paper import AttentionDecoder
from captioning.model.tokens import UNK


class Scorer(Protocol):
    """A dataset's own scores of a split's captions (captioning.eval.shapes.scorer.ShapesScorer,
    captioning.eval.coco.scorer.CocoScorer)."""

    def caption(self, index: int, words: Sequence[str], alphas: np.ndarray) -> None:
        """Image `index`'s generated words and the map behind each, [n_words, Hg, Wg]."""

    def images(self, decoder: AttentionDecoder, annotations: torch.Tensor, start: int) -> None:
        """A batch of the split's images, start .. start + len(annotations), for scores of the model itself."""

    def metrics(self) -> dict[str, float]:
        """What it adds to the caption metrics."""

    def absorb(self, other: Scorer) -> None:
        """Take in what `other` scored of the images that follow this one's (a split decoded in parts,
        one per process: captioning.train.validation)."""


@torch.no_grad()
def evaluate_split(decoder: AttentionDecoder, annotations: Any, *, image_ids: Sequence[int],
                   references: Sequence[Sequence[str]], vocab: Vocabulary, grid: tuple[int, int],
                   scorer: Scorer | None = None, beam_size: int = 1, max_length: int = 20,
                   length_penalty: float = 0.0, no_repeat_ngram: int = 0, allow_unk: bool = False,
                   batch_size: int = 100, full: bool = True,
                   device: str | torch.device = "cpu",
                   hard_choice: str | None = None,
                   max_bad_images: float | None = None, language: str = ENGLISH) -> tuple[dict[str, float], list[dict]]:
    """Decode every image of a split and score it. annotations [N, L, D] (an array, memory-mapped
    rows, or images encoded on demand). `hard_choice` is how a hard attention model picks its cell
    (captioning.model.decoding), which also says what `no_repeat_ngram` and `allow_unk` do; scores
    of maps read the map alpha. `full=False`: the Java-free
    caption metrics that validation uses. `language`: the references' (data.language), which says how
    the metrics tokenize (captioning.eval.metrics).

    Returns the metrics and the COCO results list [{"image_id", "caption"}].
    """
    decoded = decode_split(decoder, annotations, image_ids=image_ids, vocab=vocab, grid=grid, scorer=scorer,
                           beam_size=beam_size, max_length=max_length, length_penalty=length_penalty,
                           no_repeat_ngram=no_repeat_ngram, allow_unk=allow_unk, batch_size=batch_size,
                           device=device, hard_choice=hard_choice)
    if max_bad_images is not None:
        check_unreadable(decoded.unreadable, len(image_ids), limit=max_bad_images)
    metrics = score_split(decoded.results, image_ids=image_ids, references=references, scorer=scorer, full=full,
                          language=language)
    if full:  # what went wrong, beside how much (eval/evaluate.py)
        metrics.update(caption_diagnostics({r["image_id"]: r["caption"] for r in decoded.results},
                                           dict(zip(image_ids, references)), max_length=max_length,
                                           language=language))
    return metrics, decoded.results


@dataclass
class Decoded:
    """The captions of (a part of) a split: results [{"image_id", "caption"}] in the split's order,
    without the images that could not be read, whose paths are in `unreadable`."""

    results: list[dict]
    unreadable: list[str]


@torch.no_grad()
def decode_split(decoder: AttentionDecoder, annotations: Any, *, image_ids: Sequence[int], vocab: Vocabulary,
                 grid: tuple[int, int], scorer: Scorer | None = None, beam_size: int = 1, max_length: int = 20,
                 length_penalty: float = 0.0, no_repeat_ngram: int = 0, allow_unk: bool = False,
                 batch_size: int = 100, device: str | torch.device = "cpu", hard_choice: str | None = None) -> Decoded:
    """Decode the images of `annotations` (rows matching `image_ids`) a batch at a time, telling
    `scorer` each caption with its maps. Each batch comes to the host in one transfer."""
    decoder.eval()
    results = []
    starts = range(0, len(image_ids), batch_size)
    for start in progress.bar(starts, desc="decoding", unit="batch", leave=False):
        # The cache is fp16: widened on the device, so the host moves half the bytes.
        batch = torch.from_numpy(np.array(annotations[start:start + batch_size])).to(device).float()  # [b, L, D]
        captions = decode(decoder, batch, beam_size=beam_size, max_length=max_length, length_penalty=length_penalty,
                          no_repeat_ngram=no_repeat_ngram, allow_unk=allow_unk, hard_choice=hard_choice)
        tokens = captions.tokens.tolist()
        maps = captions.alphas.float().numpy(force=True) if scorer is not None else None  # [b, T, L], one copy
        unreadable = getattr(annotations, "unreadable", ())  # images encoded on the fly that could not be read
        for row in range(batch.shape[0]):
            if start + row in unreadable:  # decoded from zeros: not a caption of the image, not scored
                continue
            words = vocab.decode(tokens[row])
            results.append({"image_id": int(image_ids[start + row]), "caption": " ".join(words)})
            if scorer is not None:
                scorer.caption(start + row, words, maps[row, : len(words)].reshape(len(words), *grid))
        if scorer is not None:
            with choosing(decoder, hard_choice):
                scorer.images(decoder, batch, start)
    unreadable = sorted(getattr(annotations, "unreadable", ()))
    return Decoded(results, [str(annotations.records[row].path) for row in unreadable])


def check_unreadable(paths: Sequence[str], total: int, *, limit: float) -> None:
    """Stop when more than `limit` (data.max_bad_images) of `total` decoded images could not be read."""

    problem = too_many_unreadable("decoded images", list(paths), total, limit=limit) if paths else None
    if problem is not None:
        raise DatasetError(problem)


def score_split(results: Sequence[dict], *, image_ids: Sequence[int], references: Sequence[Sequence[str]],
                scorer: Scorer | None = None, full: bool = True, ptb: bool | None = None,
                language: str = ENGLISH) -> dict[str, float]:
    """The caption metrics of `results` against the references of the images they caption
    (captioning.eval.metrics.caption_metrics: `full`, `ptb`, `language`), and the scorer's own."""
    scored = {r["image_id"] for r in results}
    metrics = caption_metrics({i: refs for i, refs in zip(image_ids, references) if i in scored},
                              {r["image_id"]: r["caption"] for r in results}, full=full, ptb=ptb, language=language)
    if scorer is not None:
        metrics.update(scorer.metrics())
    return metrics


# How the captions were decoded beside the beam and the hard choice (evaluate_trained): written with
# the metrics, since `decode.*` overrides change the numbers.
DECODING = ("max_length", "length_penalty", "no_repeat_ngram", "allow_unk")


@dataclass
class Evaluation:
    metrics: dict[str, Any]
    results: list[dict]  # the COCO results file: [{"image_id", "caption"}]
    config: Config  # the checkpoint's, with the overrides
    beam_size: int
    hard_choice: str
    tokenizer: str = OWN_TOKENIZER  # what the caption metrics were computed on (eval/metrics.py)


def evaluate_checkpoint(checkpoint: str | Path | Sequence[str | Path], *, split: str = "test",
                        overrides: Sequence[str] = (), beam_size: int | None = None, hard_choice: str | None = None,
                        device: str | torch.device = "cpu") -> Evaluation:
    """Score a checkpoint's captions of a split, with the decoding its config names unless told
    otherwise. A fine-tuned encoder (its weights are in the checkpoint) runs on the images; a frozen
    one reads the feature cache. Several checkpoints are decoded together as one ensemble
    (captioning.checkpoint.load_ensemble), with the first one's config."""
    paths = [checkpoint] if isinstance(checkpoint, (str, Path)) else list(checkpoint)
    trained = load_ensemble(paths, overrides=overrides, device=device)
    return evaluate_trained(trained, split=split, beam_size=beam_size, hard_choice=hard_choice, device=device)[0]


def evaluate_trained(trained: Trained, *, split: str, beam_size: int | None = None, hard_choice: str | None = None,
                     device: str | torch.device | None = None) -> tuple[Evaluation, Split]:
    """evaluate_checkpoint's work on a loaded checkpoint, and the split it scored (its records and
    their contents: what `captioning verify` compares with a record). `device`: the checkpoint's."""
    config, decoder, vocab = trained.config, trained.decoder, trained.vocab
    device = trained.device if device is None else device
    choice = hard_choice or config.decode.hard_choice
    refuse_hard_choice(decoder, choice, trained.path)
    data, annotations = trained.split(split)
    beam_size = beam_size or config.decode.beam_size
    language = config.data.language
    tokenizer = metrics_tokenizer(language=language)
    metrics, results = evaluate_split(
        decoder, annotations, image_ids=data.image_ids, references=data.references, vocab=vocab, grid=data.grid,
        scorer=scorer_for(data, vocab), beam_size=beam_size, max_length=config.decode.max_length,
        length_penalty=config.decode.length_penalty, no_repeat_ngram=config.decode.no_repeat_ngram,
        allow_unk=config.decode.allow_unk, device=device, hard_choice=choice,
        max_bad_images=config.data.max_bad_images, language=language)
    return Evaluation(metrics, results, config, beam_size, choice, tokenizer), data


def write_evaluation(evaluation: Evaluation, *, checkpoint: str | Path, split: str, out: str | Path | None,
                     results: str | Path | None) -> dict[str, Path]:
    """The metrics as JSON (`out`) and the COCO results file (`results`, by default named after `out`:
    metrics_test.json -> metrics_test_captions.json, so that two evaluations of one split into one
    folder do not overwrite each other's captions). Returns what was written: {"metrics", "captions"}."""
    written = {}
    if out:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"checkpoint": str(checkpoint), "split": split, "beam_size": evaluation.beam_size,
                                   "hard_choice": evaluation.hard_choice, "tokenizer": evaluation.tokenizer,
                                   "language": evaluation.config.data.language,
                                   "decode": {key: getattr(evaluation.config.decode, key) for key in DECODING},
                                   **evaluation.metrics}, indent=2))
        written["metrics"] = out
    results = results or (out.with_name(f"{out.stem}_captions.json") if out else None)
    if results:
        results = Path(results)
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps(evaluation.results))
        written["captions"] = results
    return written


# which scores a dataset adds ----------------------------------------------------------------------
# Which scores a split's dataset adds to the caption metrics (captioning.eval.evaluate's `scorer`):
# the shapes data's (its object boxes: captioning.eval.shapes.scorer) or COCO's (its instances
# annotations: captioning.eval.coco.scorer); none for a dataset that knows nothing more of its
# images.

def scorer_for(split: Split, vocab: Vocabulary, *, images: int | None = None, start: int = 0,
               probe: bool = True) -> ShapesScorer | CocoScorer | None:
    """The scorer of the split's images start .. `images` (all: None). `probe`: the shapes data's
    relation probe too. COCO's instances files are read the first time a split is scored (and kept
    with it); where they are not there, None (said once, in one line)."""
    if split.scenes is not None:
        return ShapesScorer(split.scenes[start:images], vocab, probe=probe)
    objects = split.instances.objects() if split.instances is not None else None
    if objects is not None:
        return CocoScorer(objects[start:images], split.references[start:images])
    return None


# what went wrong, beside how much -----------------------------------------------------------------
# What went wrong, not only how much: the failures of decoding that BLEU and CIDEr average away.
#
# Read from the generated captions (their words, as printed) and the references (tokenized as
# training targets are), for eval.py's metrics file and output:
#
#   distinct_captions        distinct captions / captions: a decoder that says the same of every image
#                            scores near 0, however good that one caption's BLEU
#   vocabulary_used          distinct words over all captions (against the vocabulary it could use)
#   at_length_limit          share of captions with decode.max_length words: the decoder stopped there,
#                            most likely without choosing to end (a beam that never ends)
#   repeated_3gram_captions  share of captions in which some 3 words come twice ("a man riding a wave on
#                            a surfboard riding a wave"): a decoder caught in a loop
#   unk_captions             share of captions that say <unk> (only where decode.allow_unk lets them)
#   mean_length              words per caption, beside reference_mean_length (words per reference)

def _repeats(words: Sequence[str], n: int = 3) -> bool:
    grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return any(count > 1 for count in grams.values())


def caption_diagnostics(captions: Mapping[int, str], references: Mapping[int, Sequence[str]], *,
                        max_length: int, language: str = ENGLISH) -> dict[str, float]:
    """The numbers above for one caption per image (image id -> caption) and those images' references
    (written in `language`)."""
    words = [caption.split() for caption in captions.values()]
    if not words:
        return {}
    reference_words = [len(tokenize(reference, language=language))
                       for image in captions for reference in references[image]]
    return {
        "distinct_captions": len(set(captions.values())) / len(words),
        "vocabulary_used": float(len({word for caption in words for word in caption})),
        "at_length_limit": sum(len(caption) >= max_length for caption in words) / len(words),
        "repeated_3gram_captions": sum(_repeats(caption) for caption in words) / len(words),
        "unk_captions": sum(UNK in caption for caption in words) / len(words),
        "mean_length": sum(map(len, words)) / len(words),
        "reference_mean_length": sum(reference_words) / max(len(reference_words), 1),
    }
