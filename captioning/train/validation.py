"""Validation during training: captions of the validation split, decoded and scored as the config's
train section says (greedy on the project's tokenizer by default; with val_beam_size: null and
val_tokenizer: ptb, as evaluation reports them), and a few of them drawn with their per-word maps
for TensorBoard.

Model selection, learning-rate decay and early stopping use these *decoded* captions, never a
teacher-forced loss (see captioning.train.loop). Scored as evaluation reports them, the checkpoint
kept is the one the reported numbers are best for, which greedy captions on the project's own
tokenizer may not be (studies/flickr8k). Under torchrun the processes share the decoding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from captioning.config import Config
from captioning.data.images import ImageReadError, load_image
from captioning.data.run_data import RunData
from captioning.data.splits import Split
from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import check_unreadable, decode_split, score_split, scorer_for
from captioning.eval.metrics import metrics_tokenizer
from captioning.eval.overlays import overlay_grid
from captioning.model.decoding import decode
from captioning.model.paper import AttentionDecoder
from captioning.runtime import distributed
from captioning.runtime.distributed import ONE_PROCESS, Distributed
from captioning.train.run_folder import RunLog


def validation_metrics(decoder: AttentionDecoder, split: Split, vocab: Vocabulary, config: Config, *,
                       device: str | torch.device, annotations: Any = None,
                       context: Distributed = ONE_PROCESS) -> dict[str, float] | None:
    """Captions of (the first val_images of) a split, decoded and tokenized as the config's train
    section says (val_beam_size, val_tokenizer), scored with validation's metrics (BLEU and CIDEr, and
    the dataset's own).

    Under torchrun every process decodes its own contiguous part of the images; rank 0 gathers the
    captions (and the scorer's counts) in order and scores them: the metrics equal one process's.
    Returns them on rank 0, None on the others. `annotations` replaces the split's cache (e.g.
    EncodedImages when the encoder is fine-tuned).
    """
    annotations = split.annotations if annotations is None else annotations
    count = min(config.train.val_images or len(split.records), len(split.records))
    start, stop = context.shard(count)
    # Images encoded on the fly stay on demand, a batch at a time: a slice would encode them all at once.
    part = annotations.part(start, stop) if hasattr(annotations, "part") else annotations[start:stop]
    scorer = scorer_for(split, vocab, images=stop, start=start)
    d = config.decode
    decoded = decode_split(decoder, part, image_ids=split.image_ids[start:stop], vocab=vocab, grid=split.grid,
                           scorer=scorer, beam_size=validation_beam(config), max_length=d.max_length,
                           length_penalty=d.length_penalty, no_repeat_ngram=d.no_repeat_ngram,
                           allow_unk=d.allow_unk, device=device, hard_choice=hard_choice(config))
    parts = distributed.gather(context, (decoded, scorer))
    if parts is None:
        return None
    results = [result for done, _ in parts for result in done.results]
    check_unreadable([path for done, _ in parts for path in done.unreadable], count,
                     limit=config.data.max_bad_images)
    scorer = parts[0][1]
    for _, more in parts[1:] if scorer is not None else ():
        scorer.absorb(more)
    return score_split(results, image_ids=split.image_ids[:count], references=split.references[:count],
                       scorer=scorer, full=False, ptb=config.train.val_tokenizer == "ptb",
                       language=config.data.language)


def validation_beam(config: Config) -> int:
    """The beam validation decodes with: train.val_beam_size, else the one evaluation reports."""
    return config.train.val_beam_size or config.decode.beam_size


def validation_tokenizer(config: Config) -> str:
    """What validation's metrics are computed on, here (captioning.eval.metrics)."""
    return metrics_tokenizer(ptb=config.train.val_tokenizer == "ptb", language=config.data.language)


def validation_protocol(config: Config) -> dict[str, Any]:
    """What a validation's number depends on beside the model, by name: the metric, the images, the
    beam and what shapes its search, the tokenizer, hard attention's choice. Two configs that agree
    on it measure one scale (train/resume.py: a resume that changes it measures the best anew)."""
    t, d, beam = config.train, config.decode, validation_beam(config)
    return {"train.val_metric": t.val_metric, "train.val_images": t.val_images, "the validation's beam": beam,
            "train.val_tokenizer": t.val_tokenizer, "decode.max_length": d.max_length,
            "decode.no_repeat_ngram": d.no_repeat_ngram, "decode.allow_unk": d.allow_unk,
            "decode.length_penalty": d.length_penalty if beam > 1 else None,  # greedy ranks no finished beams
            "decode.hard_choice": hard_choice(config), "data.language": config.data.language}


def hard_choice(config: Config) -> str | None:
    """How validation picks hard attention's cell: as the config's test-time decoding does, so that
    the best checkpoint is chosen by the decoding it will be used with; None for soft attention."""
    return config.decode.hard_choice if config.model.attention == "hard" else None


@torch.no_grad()
def log_overlays(writer: SummaryWriter, decoder: AttentionDecoder, split: Split, annotations: Any, vocab: Vocabulary,
                 *, count: int, max_length: int, step: int, device: str | torch.device,
                 hard_choice: str | None = None) -> int:
    """The first `count` validation images with their greedy caption and a map per word; returns how
    many were written."""
    count = min(count, len(split.records))
    if count == 0:
        return 0
    decoder.eval()
    batch = torch.from_numpy(np.array(annotations[:count])).to(device).float()  # [count, L, D], widened there
    captions = decode(decoder, batch, beam_size=1, max_length=max_length, hard_choice=hard_choice)
    written = 0
    for row, record in enumerate(split.records[:count]):
        words = vocab.decode(captions.tokens[row].tolist())
        try:
            image = load_image(record.path)
        except ImageReadError:
            continue
        alphas = captions.alphas[row, : len(words)].view(len(words), *split.grid).float().cpu().numpy()
        locations = None if captions.locations is None else captions.locations[row, : len(words)].tolist()
        picture = overlay_grid(image, words, alphas, thumbnail=160, locations=locations)
        writer.add_image(f"val_overlays/{row}", np.asarray(picture), step, dataformats="HWC")
        writer.add_text(f"val_captions/{row}", " ".join(words) or "(empty)", step)
        written += 1
    return written


def report(log: RunLog, metrics: dict[str, float], *, improved: bool, step: int, epoch: int,
           decoder: AttentionDecoder, data: RunData, config: Config, device: str | torch.device) -> None:
    """A validation's metrics and overlays to the logs, and one line to the terminal."""
    log.validation(step=step, epoch=epoch, metrics=metrics)
    log.write(lambda writer: log_overlays(writer, decoder, data.val, data.val_annotations, data.vocab,
                                          count=config.train.log_images, max_length=config.decode.max_length,
                                          step=step, device=device, hard_choice=hard_choice(config)))
    shown = dict.fromkeys(("Bleu_4", "CIDEr", "attention_correctness", config.train.val_metric))  # and the one kept on
    summary = ", ".join(f"{k} {metrics[k]:.3f}" for k in shown if k in metrics)
    scored_on = f"beam {validation_beam(config)}, {validation_tokenizer(config)}"
    tqdm.write(f"step {step} epoch {epoch}: {summary} ({scored_on}){' (best)' if improved else ''}")
