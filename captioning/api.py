"""Captioning from Python: a trained checkpoint in, captions and the map behind every word out.

    from captioning import Captioner
    captioner = Captioner.from_checkpoint("runs/shapes_soft/best.pt", device="cpu")
    result = captioner.caption("photo.jpg", beam_size=3)   # a path, a PIL image, or a list of either
    result.caption, result.tokens, result.alphas           # alphas: [T, Hg, Wg] numpy
    result.overlay(word=2).save("where.jpg"); result.grid().save("grid.jpg")

`caption` raises ImageReadError for an image it cannot read. `caption_files` is for folders of
photos: a DataLoader reads the files (in worker processes if asked), the model encodes and decodes
them in batches, results come back in input order, and a file that cannot be read comes back as
`Unreadable` (its path and the problem in one line) instead of stopping the others. The command
line (`captioning caption`) is a thin layer over these two.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from captioning.checkpoint import load_ensemble
from captioning.config import Config
from captioning.data.images import (
    IMAGE_SUFFIXES,
    ImageFiles,
    ImageReadError,
    collate_pixels,
    is_image_file,
    load_image,
    to_tensor,
    upright_rgb,
)
from captioning.data.records import ImageRecord
from captioning.data.vocab import Vocabulary
from captioning.eval.overlays import overlay, overlay_grid, save_overlays
from captioning.model.attention import refuse_hard_choice
from captioning.model.encoder_decoder import EncoderDecoder
from captioning.progress import bar as progress_bar
from captioning.runtime.hardware import default_device
from captioning.shipped import pretrained_path

# What a checkpoint's config may change at inference: where the pretrained weights are, and how to
# decode. Everything else (sizes, score, encoder, image size) is part of the trained model.
INFERENCE_KEYS = ("encoder.weights_path", "decode.beam_size", "decode.max_length", "decode.length_penalty",
                  "decode.no_repeat_ngram", "decode.allow_unk", "decode.hard_choice")

# COCO file names: COCO_val2014_000000391895.jpg (2014) or 000000391895.jpg (2017), the id always in
# 12 digits; a shorter or longer number (Flickr30k's 1000092795.jpg, a camera's 20230101.jpg) is no COCO id.
_COCO_NAME = re.compile(r"^(?:COCO_[a-z]+\d{4}_)?(\d{12})$")

# Overlays of a 12-megapixel photo need not be 12 megapixels: they are drawn on a copy this long at most.
OVERLAY_SIDE = 1024


def coco_image_id(path: str | Path) -> int | None:
    """The COCO image id that a file name carries (COCO_val2014_000000391895.jpg -> 391895), or None."""
    match = _COCO_NAME.match(Path(path).stem)
    return int(match.group(1)) if match else None


@dataclass
class Captioned:
    """One image's caption and the attention map behind each of its words."""

    source: str  # the file's path, or "<image N>" for the N-th PIL image of a call
    tokens: list[str]  # the words, <end> excluded
    alphas: np.ndarray  # [T, Hg, Wg]: alphas[t] is the map the decoder attended with to emit tokens[t]
    score: float  # the caption's summed log-probability
    locations: list[int] | None = None  # hard attention (argmax or sample): the cell chosen per word, row-major
    # [T, T] with self-attention over the words (model.extras.word_attention): word_alphas[t, 0] is
    # the weight tokens[t] gave to <start>, word_alphas[t, j] (1 <= j <= t) to tokens[j - 1]; else None
    word_alphas: np.ndarray | None = None
    _image: Image.Image | None = field(default=None, repr=False)

    @property
    def caption(self) -> str:
        return " ".join(self.tokens)

    @property
    def image_id(self) -> int | None:
        return None if self.source.startswith("<") else coco_image_id(self.source)

    @property
    def image(self) -> Image.Image:
        """The image as the model saw it before resizing (RGB, upright); read again from its file if
        it was not kept, so that a long list of results does not hold every photo in memory."""
        return self._image if self._image is not None else load_image(self.source)

    def _drawable(self) -> Image.Image:
        image = self.image
        if max(image.size) > OVERLAY_SIDE:
            image = image.copy()
            image.thumbnail((OVERLAY_SIDE, OVERLAY_SIDE), Image.BICUBIC)
        return image

    def _location(self, word: int) -> int | None:
        return None if self.locations is None else self.locations[word]

    def overlay(self, word: int) -> Image.Image:
        """tokens[word]'s map over the image, with the word written on it (the paper's Fig. 2-3)."""
        if not -len(self.tokens) <= word < len(self.tokens):
            raise IndexError(f"word {word} of a {len(self.tokens)}-word caption")
        return overlay(self._drawable(), self.alphas[word], self.tokens[word], location=self._location(word))

    def grid(self, *, thumbnail: int = 224, columns: int = 5) -> Image.Image:
        """The image and every word's overlay, as thumbnails in rows of `columns`."""
        return overlay_grid(self._drawable(), self.tokens, self.alphas, thumbnail=thumbnail, columns=columns,
                            locations=self.locations)

    def save_overlays(self, out_dir: str | Path, *, animation: bool = False) -> list[Path]:
        """image.jpg, one JPEG per word (NN_word.jpg), grid.jpg and, with `animation`, words.gif."""
        return save_overlays(self._drawable(), self.tokens, self.alphas, out_dir, locations=self.locations,
                             animation=animation)

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"image": self.source, "caption": self.caption, "tokens": self.tokens}
        if self.image_id is not None:
            record["image_id"] = self.image_id
        return record


@dataclass
class Unreadable:
    """An input that could not be captioned; `error` names it and the problem, on one line."""

    source: str
    error: str


def image_files(paths: Sequence[str | Path], *, size: int, mean: tuple[float, ...],
                std: tuple[float, ...]) -> ImageFiles:
    """Files -> encoder input as the feature cache reads them (in DataLoader workers; a bad file
    becomes its error message): rows in the order of `paths`."""
    records = [ImageRecord(image_id=row, path=Path(path), captions=()) for row, path in enumerate(paths)]
    return ImageFiles(records, size=size, mean=mean, std=std)


def reading_workers() -> int:
    """Processes that read images beside the model: none on a machine of four cores or fewer, where
    they only take cores from the encoder (measured on 2 cores: a fifth fewer images/s with two,
    docs/benchmarks.md), else one per four cores up to four."""
    cores = os.cpu_count() or 1
    return 0 if cores <= 4 else min(4, cores // 4)


class Captioner:
    """A trained model with its vocabulary and config, ready to caption images. On a CPU the
    encoder is switched to channels-last layout (EncoderDecoder.encode): the same numbers, faster."""

    def __init__(self, model: EncoderDecoder, vocab: Vocabulary, config: Config, *,
                 device: str | torch.device = "cpu", name: str = "model"):
        self.device = torch.device(device)
        self.model = model.placed(self.device)
        self.vocab, self.config, self.name = vocab, config, name
        refuse_hard_choice(self.model.decoder, config.decode.hard_choice, name)

    @property
    def language(self) -> str:
        """The language it captions in, its training captions' (data.language): "en", "de"."""
        return self.config.data.language

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], *, device: str | torch.device | None = None,
                        overrides: Sequence[str] = ()) -> Captioner:
        """The model of a checkpoint (`train.py` writes best.pt and last.pt), on `device` (default: the
        GPU if there is one). `overrides` ("key.sub=value") may change what inference may change
        (INFERENCE_KEYS: where the encoder's weights are, how to decode); anything that would change
        the model is refused with ConfigError. A list of checkpoints decodes as one ensemble (the
        mean of their word probabilities; captioning.checkpoint.load_ensemble), with the first's
        decoding, each decoder over its own encoder's annotations (a fine-tuned one's its own)."""
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        trained = load_ensemble(paths, overrides=overrides, may_change=INFERENCE_KEYS)
        return cls(trained.model(), trained.vocab, trained.config,
                   device=default_device(None if device is None else str(device)), name=trained.path)

    @classmethod
    def from_pretrained(cls, name: str = "flickr8k", *, device: str | torch.device | None = None,
                        overrides: Sequence[str] = ()) -> Captioner:
        """A model that ships inside the package (research use; records and numbers: docs/results.md):
        "flickr8k", English, three soft-attention decoders trained on Flickr8k's 6 000 training photos
        that caption together, the third reading a copy of the encoder whose last two blocks were
        fine-tuned with it, which the file holds; "flickr8k_de", German, one soft-attention decoder
        trained on Multi30k's German descriptions of 5 528 of those photos. Their encoder,
        EfficientNet-Lite2, comes with its own package's ImageNet weights."""
        return cls.from_checkpoint(pretrained_path(name), device=device, overrides=overrides)

    # One image or a list ---------------------------------------------------------------------------

    def caption(self, images: str | Path | Image.Image | Sequence[str | Path | Image.Image], *,
                beam_size: int | None = None, hard_choice: str | None = None, max_length: int | None = None,
                batch_size: int = 16) -> Captioned | list[Captioned]:
        """Captions of a path or PIL image (one result) or a list of them (a list, in order).
        Defaults come from the checkpoint's config (decode.*); a count below 1 is a ValueError. Raises
        ImageReadError naming the first file that cannot be read."""
        _at_least_one(beam_size=beam_size, max_length=max_length, batch_size=batch_size)
        single = isinstance(images, (str, Path, Image.Image))
        items = [images] if single else list(images)
        results: list[Captioned] = []
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            pictures = [upright_rgb(item) if isinstance(item, Image.Image) else load_image(item) for item in chunk]
            sources = [f"<image {start + i}>" if isinstance(item, Image.Image) else str(item)
                       for i, item in enumerate(chunk)]
            pixels = torch.stack([self._pixels(picture) for picture in pictures])
            captioned = self._decode(pixels, sources, beam_size=beam_size, hard_choice=hard_choice,
                                     max_length=max_length)
            for result, picture in zip(captioned, pictures):
                result._image = picture  # the caller has them all in memory already
            results.extend(captioned)
        return results[0] if single else results

    # Many files ------------------------------------------------------------------------------------

    def caption_files(self, paths: str | Path | Iterable[str | Path], *, batch_size: int = 16, num_workers: int = 0,
                      beam_size: int | None = None, hard_choice: str | None = None,
                      max_length: int | None = None, progress: bool | None = False) -> Iterator[Captioned | Unreadable]:
        """A result per path, in input order: Captioned, or Unreadable for a file that cannot be read
        (a path alone is a list of one). `num_workers` processes read and resize the files while the
        model works on the batch before; `progress`: True draws a tqdm bar on stderr, None a bar on a
        terminal and plain lines in a log (captioning.progress), False nothing."""
        _at_least_one(beam_size=beam_size, max_length=max_length, batch_size=batch_size)
        # a path alone is not its characters, one by one; an iterator is read once, for the files and their names
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        # Checked here, not at the first result: a wrong choice is the caller's error, before any file is read.
        refuse_hard_choice(self.model.decoder, hard_choice or self.config.decode.hard_choice, self.name)
        photos = image_files(paths, size=self.config.data.image_size, mean=self.model.encoder.mean,
                             std=self.model.encoder.std)
        loader = torch.utils.data.DataLoader(photos, batch_size=batch_size, num_workers=num_workers,
                                             collate_fn=collate_pixels, pin_memory=self.device.type == "cuda")
        return self._stream(loader, [str(path) for path in paths], beam_size=beam_size, hard_choice=hard_choice,
                            max_length=max_length, progress=progress)

    def _stream(self, loader: torch.utils.data.DataLoader, sources: list[str], *, progress: bool | None,
                **decoding: Any) -> Iterator[Captioned | Unreadable]:
        with progress_bar(total=len(sources), show=progress, unit="image") as bar:
            for batch in loader:  # captioning.data.images.PixelBatch
                captioned = {} if batch.pixels is None else dict(zip(batch.rows, self._decode(
                    batch.pixels, [sources[row] for row in batch.rows], **decoding)))
                errors = dict(batch.failures)
                for row in sorted([*captioned, *errors]):
                    yield captioned[row] if row in captioned else Unreadable(sources[row], errors[row])
                bar.update(len(captioned) + len(errors))

    # Shared ----------------------------------------------------------------------------------------

    def _pixels(self, image: Image.Image) -> torch.Tensor:
        encoder = self.model.encoder
        return to_tensor(image, size=self.config.data.image_size, mean=encoder.mean, std=encoder.std)  # [3, S, S]

    def _decode(self, pixels: torch.Tensor, sources: list[str], *, beam_size: int | None, hard_choice: str | None,
                max_length: int | None) -> list[Captioned]:
        """pixels [B, 3, S, S] -> a result per image."""
        settings = self.config.decode
        choice = hard_choice or settings.hard_choice
        refuse_hard_choice(self.model.decoder, choice, self.name)
        captions, grid = self.model.caption(pixels.to(self.device),
                                            beam_size=settings.beam_size if beam_size is None else beam_size,
                                            max_length=settings.max_length if max_length is None else max_length,
                                            length_penalty=settings.length_penalty,
                                            no_repeat_ngram=settings.no_repeat_ngram, allow_unk=settings.allow_unk,
                                            hard_choice=choice)
        alphas = captions.alphas.float().cpu().numpy()  # [B, T, L]
        chosen = captions.locations.cpu().tolist() if captions.locations is not None else None
        said = captions.word_alphas.float().cpu().numpy() if captions.word_alphas is not None else None  # [B, T, T]
        results = []
        for row, source in enumerate(sources):
            words = self.vocab.decode(captions.tokens[row].tolist())
            locations = chosen[row][: len(words)] if chosen is not None else None
            results.append(Captioned(
                source=source, tokens=words, alphas=alphas[row, : len(words)].reshape(len(words), *grid),
                score=float(captions.scores[row]),
                locations=locations if locations is not None and any(cell >= 0 for cell in locations) else None,
                word_alphas=said[row, : len(words), : len(words)] if said is not None else None))
        return results


# Finding the images --------------------------------------------------------------------------------

def find_images(inputs: Sequence[str | Path], *, recursive: bool = False) -> list[str]:
    """Paths from files, folders (their images, sorted; `recursive` for sub-folders too) and glob
    patterns, in the order given. A name that is neither a folder nor matches anything is kept as
    it is, so that reading it reports it (`no such file`) in its place."""
    import glob

    found: list[str] = []
    for given in map(str, inputs):
        path = Path(given)
        if path.is_dir():
            try:
                walk = path.rglob("*") if recursive else path.iterdir()
                found += sorted(str(p) for p in walk if is_image_file(p))
            except OSError:  # a folder that cannot be read gives no image: empty_folders says why
                continue
        elif not path.exists() and glob.has_magic(given):
            found += sorted(glob.glob(given, recursive=True)) or [given]
        else:
            found.append(given)
    return found


def empty_folders(inputs: Sequence[str | Path], *, recursive: bool = False) -> list[str]:
    """The folders among `inputs` that give find_images no image (each is a mistake to say, not to skip),
    each with why: it cannot be read, none in it, or only in its sub-folders, which `recursive` would read."""
    empty = []
    for given in map(str, inputs):
        path = Path(given)
        if not path.is_dir():
            continue
        try:  # its sub-folders that cannot be read, rglob passes over; the folder itself, it must not
            with os.scandir(path):
                pass
        except OSError as error:
            empty.append(f"{given}: cannot read this folder ({error.strerror or type(error).__name__})")
            continue
        # Each walk stops at the first image: a folder of many, which find_images lists, is not walked again.
        if not recursive and any(map(is_image_file, path.iterdir())):
            continue
        if not any(map(is_image_file, path.rglob("*"))):
            empty.append(f"{given}: no images in this folder (files named *{', *'.join(IMAGE_SUFFIXES)})")
        elif not recursive:
            empty.append(f"{given}: no images in this folder, only in its sub-folders (--recursive reads them)")
    return empty


def _at_least_one(**counts: int | None) -> None:
    """None takes the config's value; 0 must not quietly do the same (ValueError naming the argument)."""
    for name, value in counts.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def read_list(path: str | Path) -> list[str]:
    """The paths in a list file: one per line; blank lines and lines starting with # are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark is not the first path's
    except (OSError, UnicodeDecodeError) as error:
        raise ImageReadError(f"{path}: cannot read the list of images ({error.__class__.__name__})") from error
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
