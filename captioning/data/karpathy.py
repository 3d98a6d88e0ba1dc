"""Karpathy-style split files: one JSON listing every image with its split and its sentences.

The format of `dataset_coco.json`, `dataset_flickr8k.json` and `dataset_flickr30k.json` (entries
with `filepath` + `filename`, or `filename` alone for Flickr), and of the shapes dataset.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


class DatasetError(ValueError):
    """A dataset file that is missing or malformed; the message names it."""


@dataclass(frozen=True)
class ImageRecord:
    image_id: int
    path: Path
    captions: tuple[str, ...]  # raw reference sentences


def usable(captions: Iterable[object]) -> tuple[str, ...]:
    """The captions that are text with a word in them (annotation files hold the odd empty string,
    whitespace or null)."""
    return tuple(c for c in captions if isinstance(c, str) and c.strip())


def note_dropped(source: str | Path, split: str, captions: int, images: int) -> None:
    """One line for what a split lost to unusable captions, if anything."""
    if captions:
        left = f"; {images} images had none left and are left out" if images else ""
        print(f"note: {source}: {split}: {captions} empty or non-text captions dropped{left}", file=sys.stderr)


def first_names(names: Sequence[object], shown: int = 3) -> str:
    """The first few of a list of files or images, for a one-line message that gives their count:
    "a.jpg, b.jpg, c.jpg, ..." (the dots where there are more)."""
    return ", ".join(str(name) for name in names[:shown]) + (", ..." if len(names) > shown else "")


def too_many_unreadable(split: str, paths: Sequence[str | Path], total: int, *, limit: float) -> str | None:
    """The one line that stops a run when more than `limit` (data.max_bad_images) of a split's
    `total` images cannot be read, naming how many and the first few; None while they are fewer."""
    if len(paths) <= limit * total:
        return None
    names = first_names(list(paths))
    return (f"{split}: {len(paths)} of {total} images cannot be read ({names}), more than "
            f"data.max_bad_images={limit:g} of them; repair or remove them, or raise the limit")


def read_split(split_file: str | Path, split: str, *, image_root: str | Path | None = None) -> list[ImageRecord]:
    """Images of one split ('train' also takes Karpathy's 'restval'), in file order.

    Image paths are image_root / filepath / filename, image_root defaulting to the file's folder.
    """
    split_file = Path(split_file)
    image_root = Path(image_root) if image_root is not None else split_file.parent
    try:
        entries = json.loads(split_file.read_text())["images"]
    except FileNotFoundError as error:
        raise DatasetError(f"{split_file}: split file not found") from error
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        problem = f"{error.__class__.__name__}: {error}"
        raise DatasetError(f"{split_file}: not a Karpathy-style split file ({problem})") from error
    wanted = {"train", "restval"} if split == "train" else {split}
    records, dropped, emptied = [], 0, 0
    for position, entry in enumerate(entries):
        try:
            if entry["split"] not in wanted:
                continue
            image_id = int(entry.get("cocoid", entry.get("imgid", position)))
            path = image_root / entry.get("filepath", "") / entry["filename"]
            raw = [sentence["raw"] for sentence in entry["sentences"]]
        except (KeyError, TypeError, ValueError) as error:
            raise DatasetError(f"{split_file}: image entry {position} is malformed (missing {error})") from error
        captions = usable(raw)
        dropped += len(raw) - len(captions)
        if not captions:
            emptied += 1
            continue
        records.append(ImageRecord(image_id=image_id, path=path, captions=captions))
    note_dropped(split_file, split, dropped, emptied)
    if not records:
        raise DatasetError(f"{split_file}: no images in split '{split}'")
    return records
