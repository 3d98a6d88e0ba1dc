"""Validation during training: greedy captions of the validation split, scored, and a few of them
drawn with their per-word maps for TensorBoard.

Model selection, learning-rate decay and early stopping use these *decoded* captions, never a
teacher-forced loss (see captioning.train.loop).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

from captioning.config import Config
from captioning.data.images import ImageReadError, load_image
from captioning.data.splits import Split
from captioning.data.vocab import Vocabulary
from captioning.eval.evaluate import evaluate_split
from captioning.eval.overlays import overlay_grid
from captioning.model.decoder import AttentionDecoder
from captioning.model.decoding import decode


def validate(decoder: AttentionDecoder, split: Split, vocab: Vocabulary, config: Config, *,
             device: str | torch.device, annotations: Any = None) -> dict[str, float]:
    """Greedy captions of (the first val_images of) a split, scored with the Java-free metrics.

    `annotations` replaces the split's cache (e.g. EncodedImages when the encoder is fine-tuned).
    """
    annotations = split.annotations if annotations is None else annotations
    count = config.train.val_images or len(split.records)
    # Images encoded on the fly stay on demand, a batch at a time: a slice would encode them all at once.
    first = annotations.head(count) if hasattr(annotations, "head") else annotations[:count]
    metrics, _ = evaluate_split(
        decoder, first, image_ids=split.image_ids[:count], references=split.references[:count],
        vocab=vocab, grid=split.grid, scorer=split.scorer(vocab, images=count), beam_size=1,
        max_length=config.decode.max_length, full=False, device=device,
        hard_choice=hard_choice(config), max_bad_images=config.data.max_bad_images)
    return metrics


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
    batch = torch.from_numpy(np.asarray(annotations[:count], dtype=np.float32)).to(device)  # [count, L, D]
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
