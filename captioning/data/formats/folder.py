"""A folder of your own images and a captions file (data.dataset=folder): a collection.

The captions file (data.folder.captions_file, relative to data.root) has one row per caption, in either
form:
  - CSV with a header row: `image,caption` or `image,caption,split`;
  - JSON Lines: one object a line, {"image": ..., "caption": ..., "split": ...}, "split" optional.
`image` is a path under data.root/data.image_dir; an image with five captions has five rows. `split`
is train, val or test, or empty. An image has one split: two rows that give it two are refused.

`image` names a file under data.root/data.image_dir, and is keyed by the file it names (its resolved
path): `a.jpg`, `./a.jpg` and a link to a.jpg are one image; a path that leads outside that folder is
refused unless data.folder.allow_outside_images=true.

A split that no row names (val or test, most often both) is made with a seed: from the images
without a split, or, when every image has one, from the training images. Each such image goes by a
hash of its path and data.folder.split_seed, not by its place in a shuffle; each made split takes about
data.folder.split_share of them, at least one image. Every split, once given, is written down
(DATA_ROOT/splits/, or under data.cache_root, data/kept_splits.py) and read back at every later
read: adding photos, with splits of their own or without, never moves an image that was there into
another split (a model is never tested on what an older run trained on), and a photo moved, renamed
or copied keeps its split, the record knowing it by its contents; files with the same contents share
one split. `captioning prepare` also writes the run's copy
(TRAIN.OUT_DIR/splits.csv) and says what it made, and what it found wrong with the collection
(formats/folder_report.py), one line each.

Evaluation's references are these captions: nothing is read from a COCO path.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from captioning.config import Config, DataConfig
from captioning.config.registry import DATASETS
from captioning.data.images import Resolver
from captioning.data.kept_splits import Placed, Recalled, assign_by_contents, recall, record_path, write_record
from captioning.data.records import SPLITS, DatasetError, ImageRecord, data_root
from captioning.data.vocab import normalize

SHOWN = 3  # names given in a finding's line; the count says how many there are


@dataclass(frozen=True)
class Row:
    line: int  # in the captions file, from 1 (the CSV header is line 1)
    image: str
    caption: str
    split: str  # "" when the row gives none


@dataclass
class Collection:
    """The captions file read: each image (in the order the file first names it) with its captions
    and its split, and what was made or dropped on the way."""

    captions_file: Path
    image_root: Path
    images: list[str]  # each image's resolved path relative to image_root (absolute where allowed outside)
    captions: dict[str, list[str]]
    splits: dict[str, str]  # every image's split, made ones included
    made: dict[str, list[str]] = field(default_factory=dict)  # split -> the images the seed put there
    empty_captions: list[int] = field(default_factory=list)  # line numbers of empty captions
    # line numbers of captions with no word once tokenized ("...", "!!"), dropped as an empty caption
    # is; and of rows that repeat an earlier row's image and caption (the same words), kept: two
    # annotators may write the same words, and each is a reference as COCO's are, but prepare says so
    wordless_captions: list[int] = field(default_factory=list)
    duplicate_rows: list[int] = field(default_factory=list)
    record: Path | None = None  # where the splits are kept (data/kept_splits.py)
    # images the record kept in one split whose rows now give another: (kept, now), named by prepare
    moved_by_rows: dict[str, tuple[str, str]] = field(default_factory=dict)
    # images the record knows by their contents under another name (moved, renamed, copied): new -> old
    moved_by_contents: dict[str, str] = field(default_factory=dict)
    replaced: list[str] = field(default_factory=list)  # recorded names now holding contents no row knows (edited)
    copies: dict[str, str] = field(default_factory=dict)  # image -> the image whose contents it repeats
    rejoined: dict[str, tuple[str, str]] = field(default_factory=dict)  # kept apart from their copies: (was, now)
    adopted: tuple[Path, int] | None = None  # another record (this data's before it moved), images placed by it
    # where new images appeared: the recorded images no longer named nor found by their contents
    gone: list[str] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)  # images the record did not hold, by name or contents

    def records(self, split: str) -> list[ImageRecord]:
        """The images of one split with their captions; image ids are the order the file first names
        them in (0, 1, ...), the same in every split and every run."""
        records = [ImageRecord(image_id=index, path=self.image_root / image, captions=tuple(self.captions[image]))
                   for index, image in enumerate(self.images) if self.splits[image] == split and self.captions[image]]
        if not records:
            raise DatasetError(f"{self.captions_file}: no captioned images in split '{split}'")
        return records


def read_rows(path: Path) -> list[Row]:
    """The captions file's rows: CSV (by its .csv suffix) or JSON Lines (any other). Each problem is
    one line naming the file and the line."""
    if not path.is_file():
        raise DatasetError(f"{path}: captions file not found (data.folder.captions_file, relative to data.root)")
    try:  # a byte-order mark, as spreadsheets write one, is not text; newline="": line ends stay as written
        with open(path, encoding="utf-8-sig", newline="") as file:
            text = file.read()
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path}: not UTF-8 text ({error})") from error
    except OSError as error:  # no rights to read it, a folder named like it, a disk error
        raise DatasetError(f"{path}: cannot read the captions file ({error.strerror or error})") from error
    rows = _csv_rows(path, text) if path.suffix.lower() == ".csv" else _jsonl_rows(path, text)
    if not rows:
        raise DatasetError(f"{path}: no captions in it")
    return rows


def _csv_rows(path: Path, text: str) -> list[Row]:
    # The csv module's own newline handling: a quoted cell may hold a line break, and only \n and \r
    # end a line (str.splitlines would also break at U+2028, U+2029, NEL and form feed, inside a caption).
    # strict: a double quote opened and never closed is an error, not the rest of the file read as one caption.
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    try:
        columns = [c.strip() for c in reader.fieldnames or []]
    except csv.Error as error:
        raise DatasetError(f"{path}: line 1: {error}") from error
    if "image" not in columns or "caption" not in columns:
        raise DatasetError(f"{path}: the first line names the columns, image and caption (split optional); "
                           f"it names {', '.join(columns) or 'none'}")
    reader.fieldnames = columns
    rows, entries = [], iter(reader)
    while True:
        read = reader.line_num  # the lines read so far: the next row starts after them (and any blank lines)
        try:
            entry = next(entries, None)
        except csv.Error as error:
            unclosed = " (a double quote opened on this line is never closed)" if "end of data" in str(error) else ""
            raise DatasetError(f"{path}: line {_next_written(text, read)}: {error}{unclosed}") from error
        if entry is None:
            break
        line = reader.line_num
        if None in entry:  # DictReader's key for fields beyond the header's
            raise DatasetError(f"{path}: line {line} has more columns than the first line names (a caption "
                               'with a comma in it needs double quotes: "a dog, a ball")')
        if entry.get("image") is None or entry.get("caption") is None:
            raise DatasetError(f"{path}: line {line} has fewer columns than the first line names")
        rows.append(_row(path, line, entry["image"], entry["caption"], entry.get("split") or ""))
    return rows


def _next_written(text: str, read: int) -> int:
    """The number of the first line after the first `read` lines that is not blank, as the csv
    module counts lines (ended by \\r\\n, \\r or \\n): where its reader, which passes over blank
    lines, began the row it could not read."""
    lines = re.split(r"\r\n|\r|\n", text)
    line = read + 1
    while line <= len(lines) and lines[line - 1] == "":
        line += 1
    return line


def _jsonl_rows(path: Path, text: str) -> list[Row]:
    rows = []
    # JSON Lines end at \n alone: U+2028 or NEL inside a string written with ensure_ascii=False is text.
    for line, content in enumerate(text.split("\n"), start=1):
        content = content.removesuffix("\r")
        if not content.strip():
            continue
        try:
            entry = json.loads(content)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path}: line {line} is not JSON ({error}); a .csv file is read as CSV") from error
        if not isinstance(entry, dict) or not isinstance(entry.get("image"), str) or "caption" not in entry:
            raise DatasetError(f'{path}: line {line} is not an object with "image" and "caption" ({content[:60]})')
        caption, split = entry["caption"], entry.get("split") or ""
        if not isinstance(caption, str) and caption is not None or not isinstance(split, str):
            raise DatasetError(f'{path}: line {line}: "caption" and "split" are text')
        rows.append(_row(path, line, entry["image"], caption or "", split))
    return rows


def _row(path: Path, line: int, image: str, caption: str, split: str) -> Row:
    image, split = image.strip(), split.strip().lower()
    if not image:
        raise DatasetError(f"{path}: line {line} names no image")
    if split not in ("", *SPLITS):
        raise DatasetError(f"{path}: line {line}: split '{split}' is not one of {', '.join(SPLITS)} (or empty)")
    return Row(line=line, image=image, caption=caption, split=split)


def _words(caption: str) -> tuple[str, ...]:
    """A caption's runs of word characters, lower-cased: empty exactly where tokenizing leaves no
    word (vocab.tokenize keeps a token that holds one), and alike for two rows that say the same
    words. A regular expression, not the tokenizer: a large collection is read at every start, and
    its captions are tokenized once, later, with a cache (data/tokenized.py)."""
    return tuple(_WORD.findall(normalize(caption)))


_WORD = re.compile(r"\w+")


def read_collection(captions_file: str | Path, *, image_root: str | Path, seed: int, share: float,
                    record: Path | None = None, allow_outside: bool = False,
                    dataset_own: Path | None = None) -> Collection:
    """The captions file, every image given its split. Refuses (one line, with a count and the first
    few names) an image that rows put in two splits, and an image outside image_root unless
    `allow_outside`. With `record` (data/kept_splits.py), the splits given earlier are read back and
    kept, and new images' splits are added to it; a new record starts from `dataset_own`, the record
    in the dataset's own folder, where it holds these images (kept_splits.recall)."""
    captions_file, image_root = Path(captions_file), Path(image_root)
    rows = read_rows(captions_file)
    keys = ImageKeys(image_root, source=captions_file, allow_outside=allow_outside)
    captions: dict[str, list[str]] = {}
    given: dict[str, set[str]] = defaultdict(set)
    empty, wordless, duplicates = [], [], []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for row in rows:
        image = keys.key(row)
        captions.setdefault(image, [])
        words = _words(row.caption)
        if not row.caption.strip():
            empty.append(row.line)
        elif not words:  # an empty training target and reference
            wordless.append(row.line)
        else:
            if (image, words) in seen:  # counts twice in training and as a reference: said, not hidden
                duplicates.append(row.line)
            seen.add((image, words))
            captions[image].append(row.caption)
        if row.split:
            given[image].add(row.split)
    twice = [image for image in captions if len(given[image]) > 1]
    if twice:
        named = "; ".join(f"{image}: {' and '.join(s for s in SPLITS if s in given[image])}" for image in twice[:SHOWN])
        raise DatasetError(f"{captions_file}: {image_count(len(twice))} in two splits ({named}"
                           f"{'; ...' if len(twice) > SHOWN else ''}); give each image one split")
    gives = {image: next(iter(given[image]), "") for image in captions}
    recalled = recall(record, list(captions), image_root=image_root, dataset_own=dataset_own)
    kept = recalled.kept
    assigned = assign_by_contents(gives, kept, {image: placed.contents for image, placed in recalled.now.items()},
                                  seed=seed, share=share, source=captions_file, record=record)
    if record is not None:
        _keep(record, recalled, splits=assigned.splits, gives=gives, edited=set(assigned.edited))
    return Collection(captions_file, image_root, list(captions), captions, assigned.splits, assigned.made, empty,
                      wordless, duplicates, record=record, moved_by_rows=assigned.edited,
                      moved_by_contents=recalled.moved, replaced=recalled.replaced, copies=assigned.copies,
                      rejoined=assigned.rejoined, adopted=recalled.adopted,
                      gone=recalled.gone if any(image not in kept for image in captions) else [],
                      appeared=[image for image in captions if image not in kept])


def _keep(record: Path, recalled: Recalled, *, splits: dict[str, str], gives: dict[str, str], edited: set[str]) -> None:
    """Write the record again where it changed: images placed now (new, moved, edited, or taken from
    another record) must be written, or a later read would place them afresh; digests taken again
    (a file touched or replaced) only spare the next read the hashing, and are let go where the
    record cannot be written (a shared dataset read by a user who may not write it)."""
    rows = dict(recalled.kept)
    placed = False
    for image, split in splits.items():
        was = recalled.kept.get(image)
        given = gives[image] if was is None or image in edited else was.given
        rows[image] = Placed(split, given, recalled.now[image].contents, recalled.now[image].stat)
        placed |= image not in recalled.recorded or recalled.recorded[image].split != split
    if rows == recalled.recorded:
        return
    try:
        write_record(record, rows)
    except DatasetError:
        if placed or not record.is_file():
            raise


class ImageKeys:
    """Each row's image as the file it names: its resolved path relative to the image folder, so that
    `a.jpg`, `./a.jpg`, `sub/../a.jpg`, an absolute path and a symbolic link to the same file are one
    image (one split, one cache row, one entry in every digest). A path that resolves outside the
    folder is refused unless allowed, and then keyed by its absolute resolved path."""

    def __init__(self, image_root: Path, *, source: Path, allow_outside: bool):
        self.root = image_root
        self.prefix = os.path.realpath(image_root).rstrip(os.sep) + os.sep  # what a path inside begins with
        self.source, self.allow_outside = source, allow_outside
        self.known: dict[str, str] = {}  # spelling -> key: a collection names each image about five times
        self.resolve = Resolver()

    def key(self, row: Row) -> str:
        if row.image not in self.known:
            path = self.resolve(os.path.join(self.root, row.image))
            if path.startswith(self.prefix):
                self.known[row.image] = Path(path[len(self.prefix):]).as_posix()
            elif self.allow_outside:
                self.known[row.image] = Path(path).as_posix()
            else:
                raise DatasetError(f"{self.source}: line {row.line}: {row.image} is outside the image folder "
                                   f"{self.root} (it is {path}); data.folder.allow_outside_images=true lets such "
                                   "paths in")
        return self.known[row.image]


@dataclass
class FolderConfig:
    """data.folder: a folder of your own images (docs/data.md)."""

    captions_file: str = "captions.csv"  # rows of image, caption[, split] (.csv, or JSON Lines), under data.root
    # A split no row names is made of the images by a hash of each one's path and this seed (not
    # train.seed: another training seed must not move the test images), each made split about
    # split_share of them.
    split_seed: int = 0
    split_share: float = 0.05
    # A captions row whose image lies outside data.root/data.image_dir (an absolute path, ../, a link
    # leading out) is refused unless this is true.
    allow_outside_images: bool = False


@DATASETS.register("folder", settings=FolderConfig)
def read_folder(data: DataConfig, split: str) -> list[ImageRecord]:
    """One split of the collection the config names."""
    data_root(data, where="docs/data.md says what a folder of your own images holds")
    return folder_collection(data).records(split)


def folder_problems(config: Config) -> list[str]:
    """What a folder of your own refuses of a config (captioning.config.checks asks the chosen format)."""
    share = config.data.folder.split_share
    return [] if 0.0 < share < 0.5 else [f"data.folder.split_share must be in (0, 0.5), got {share!r}"]


read_folder.problems = folder_problems


def folder_collection(data: DataConfig) -> Collection:
    """The collection a config names: data.root/data.folder.captions_file, images under
    data.root/data.image_dir, its splits kept under DATA_CACHE/splits/."""
    root, own = Path(data.root), data.folder
    captions_file = root / own.captions_file
    cache_root = Path(data.cache_root) if data.cache_root else None
    record, dataset_own = (record_path(root=root, captions_file=captions_file, cache_root=where, seed=own.split_seed,
                                       share=own.split_share) for where in (cache_root, None))
    return collection_of(captions_file, image_root=root / data.image_dir, seed=own.split_seed,
                         share=own.split_share, record=record, allow_outside=own.allow_outside_images,
                         dataset_own=dataset_own)


@functools.lru_cache(maxsize=4)
def _cached(captions_file: Path, mtime_ns: int, image_root: Path, seed: int, share: float, record: Path | None,
            allow_outside: bool, dataset_own: Path | None) -> Collection:
    return read_collection(captions_file, image_root=image_root, seed=seed, share=share, record=record,
                           allow_outside=allow_outside, dataset_own=dataset_own)


def collection_of(captions_file: str | Path, *, image_root: str | Path, seed: int, share: float,
                  record: Path | None = None, allow_outside: bool = False,
                  dataset_own: Path | None = None) -> Collection:
    """read_collection, read once for the three splits a run asks for (again when the file changes)."""
    path = Path(captions_file)
    mtime = path.stat().st_mtime_ns if path.is_file() else 0
    return _cached(path, mtime, Path(image_root), seed, share, record, allow_outside, dataset_own)


def image_count(count: int) -> str:
    return f"{count} image{'s' if count != 1 else ''}"
