"""What every dataset reaches the rest as: a list of image records per split.

data.dataset names a reader (captioning.config.registry.DATASETS), one per format in
captioning/data/formats/; `read_records` asks it for a split's records, and the helpers here say
what a reader dropped or could not read, one line each.
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captioning.config import Config, DataConfig
from captioning.config.registry import DATASETS

SPLITS = ("train", "val", "test")


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
        left = f"; {counted(images, 'image')} had none left, left out" if images else ""
        print(f"note: {source}: {split}: {captions} empty or non-text captions dropped{left}", file=sys.stderr)


def first_names(names: Sequence[object], shown: int = 3) -> str:
    """The first few of a list of files or images, for a one-line message that gives their count:
    "a.jpg, b.jpg, c.jpg, ..." (the dots where there are more)."""
    return ", ".join(str(name) for name in names[:shown]) + (", ..." if len(names) > shown else "")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun, as a message says it: "1 image", "3 images", "0 images"."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


# Python hands a file name whose bytes are not UTF-8 on as text with a lone surrogate for each such
# byte (os.fsdecode: b"\xff" is "\udcff"); a UTF-8 writer (a page, JSON, a UTF-8 terminal) refuses
# those. Characters that end or break a line cut a one-line record in two.
_NOT_TEXT = re.compile(r"[\ud800-\udfff]")
_BREAKS_A_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def name_as_text(name: str | Path) -> str:
    """A file name any UTF-8 writer takes: each byte that is not UTF-8 as \\xNN (b"bad\\xffname.jpg"
    is "bad\\xffname.jpg", written with a real backslash); every other name as it is."""
    return _NOT_TEXT.sub(_surrogate, str(name))


def name_on_one_line(name: str | Path) -> str:
    """A file name as one line of text, for a record (`path<TAB>caption`) or a message: as
    name_as_text, and a tab, a line break or another control character as Python writes it in a
    string (\\t, \\n, \\r, \\x1b). Ordinary names, backslashes and accented letters included, are
    shown as they are."""
    return _BREAKS_A_LINE.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"),
                              name_as_text(name))


def too_many_unreadable(split: str, paths: Sequence[str | Path], total: int, *, limit: float) -> str | None:
    """The one line that stops a run when more than `limit` (data.max_bad_images) of a split's
    `total` images cannot be read, naming how many and the first few; None while they are fewer."""
    if len(paths) <= limit * total:
        return None
    names = first_names(list(paths))
    return (f"{split}: {len(paths)} of {total} images cannot be read ({names}), more than "
            f"data.max_bad_images={limit:g} of them; repair or remove them, or raise the limit")


def read_records(data: DataConfig, split: str) -> list[ImageRecord]:
    """The images and raw reference captions of one split of the configured dataset (with
    data.max_images, only the first that many whose files exist)."""
    if split not in SPLITS:
        raise DatasetError(f"unknown split '{split}' (known: {', '.join(SPLITS)})")
    records = DATASETS[data.dataset](data, split)
    if data.max_images is None:
        return records
    return list(itertools.islice((r for r in records if r.path.is_file()), data.max_images))


def format_extra(data: DataConfig, name: str) -> Any:
    """What the configured dataset's format brings besides reading, by name: an attribute its reader
    carries, None where it brings none. So no other module switches on a dataset's name. The extras:
    `validation_metrics` (what validation may measure beside the caption metrics, read by the config's
    checks), `make_missing(config)` (data that draws itself where it is missing: the shapes data),
    `miniature(config, folder)` (a dry run's few images), `prepare_report(config)` (the lines
    `captioning prepare` says of the data) and `beside_vocabulary(config)` (what it writes beside the
    vocabulary: a folder of your own's splits)."""
    return getattr(DATASETS[data.dataset], name, None)


def make_missing_data(config: Config) -> None:
    """Draw the configured data where it is missing and its format can (the embedded default on a
    fresh clone); called by the commands that train or prepare, never by a reader."""
    make = format_extra(config.data, "make_missing")
    if make is not None:
        make(config)


def held_out_note(data: DataConfig) -> str | None:
    """One line where the data has no test split (a split file whose test images are held out, as a
    user holding back their own test set has): training and `eval.py --split val` need none."""
    try:
        read_records(data, "test")
    except DatasetError as error:
        return (f"note: no test split ({error}): models are selected and scored on val "
                "(eval.py --split val); the checkpoints' record names no test images")
    return None


def data_root(data: DataConfig, *, where: str) -> Path:
    """data.root, which must be a folder; `where` says where the data comes from when it is not."""
    root = Path(data.root)
    if not root.is_dir():
        raise DatasetError(f"{root}: data.root is not a folder ({where})")
    return root
