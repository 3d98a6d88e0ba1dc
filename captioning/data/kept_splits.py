"""The splits of a folder collection: drawn for the images whose rows give none (`assign_splits`),
written down when first given and read back at every later read, so that no image ever moves to
another split (a model is never tested on what an older run trained on).

A split drawn from each image's own hash already stays put as photos are added, but two rules of the
drawing look at the whole collection: a small collection gets at least one image in each made split
(the one whose draw comes closest), and when every row says train, val and test are drawn from the
training rows. Adding photos changes what those rules see; the record does not change.

The record is CSV, one row per image ever placed, `image,split,given,contents,size,mtime_ns`: the
image's resolved path (relative to the image folder), its split, the split its rows gave when it was
placed ("" for none), and the digest of the file's bytes (data/images.py) with the size and
modification time it was taken at (a file whose size and time are unchanged is not hashed again).
The digest is the image's identity beside its path: a photo moved, renamed or copied into another
folder keeps the split its bytes were placed in, and a name the record holds is checked against its
bytes too, so that photos swapping names or renumbered after a deletion each keep their own split
(a name whose bytes no row knows keeps its split: the photo edited). Files with the same bytes under
several names are one photo with one split (`assign_by_contents`): a copy of a test photo is never
trained on. Images that leave the captions file keep their row,
so that coming back they come back to their split. The file is readable by all (as the umask lets
files be), so that the other users of a shared dataset read the splits its owner drew.

A record belongs to one dataset. Without data.cache_root it lives in the dataset's own folder,
DATA_ROOT/splits/<captions file>.seed<seed>.share<share>.csv, and moves with it. Under a
data.cache_root that several datasets may share, its name also carries a digest of the captions
file's resolved path; a dataset that has no record there yet (moved or copied since, or a shared
dataset whose user keeps their caches apart) takes the splits of the record, there or in the
dataset's own folder, that holds most of its images by content, and `prepare` says so.
Another seed or share draws afresh, in a record of its own.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from captioning.data.images import file_digest, file_stat
from captioning.data.records import SPLITS, DatasetError
from captioning.runtime.files import replace_text

COLUMNS = ["image", "split", "given", "contents", "size", "mtime_ns"]
FIRST_COLUMNS = COLUMNS[:3]  # a record written before records kept the images' contents


class Placed(NamedTuple):
    """An image's row in the record."""

    split: str
    given: str  # the split its rows gave when it was placed ("" for none)
    contents: str = ""  # the digest of its bytes ("" where unknown: a missing file, an older record)
    stat: tuple[int, int] | None = None  # (size, modification time in ns) when the digest was taken


def record_path(*, root: Path, captions_file: Path, cache_root: Path | None, seed: int, share: float) -> Path:
    """ROOT/splits/<captions file>.seed<seed>.share<share>.csv, or under a cache root (which several
    datasets may share) CACHE_ROOT/splits/<captions file>.<its resolved path's digest>.seed<seed>.share<share>.csv."""
    tail = f"seed{seed}.share{share:g}.csv"
    if cache_root is None:
        return Path(root) / "splits" / f"{Path(captions_file).name}.{tail}"
    owner = hashlib.sha256(os.path.realpath(captions_file).encode()).hexdigest()[:12]
    return Path(cache_root) / "splits" / f"{Path(captions_file).name}.{owner}.{tail}"


def read_record(path: Path) -> dict[str, Placed]:
    """image -> its row; empty where there is no record yet. A record that cannot be read (another
    user's without read rights, another encoding than UTF-8, not a record) is one line naming it."""
    try:  # utf-8-sig: a spreadsheet that saved it as "CSV UTF-8" put a byte-order mark first
        if not path.is_file():
            return {}
        with path.open(newline="", encoding="utf-8-sig") as file:
            return _rows(path, csv.reader(file))
    except PermissionError as error:
        raise DatasetError(f"{path}: the splits record cannot be read ({error.strerror}); its owner can let "
                           "others read it (chmod a+r), or data.cache_root can name a folder of your own, where "
                           "the splits are drawn again") from error
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path}: the splits record is not UTF-8 text (byte {error.start}: "
                           f"{error.reason}); save it as UTF-8 (a spreadsheet's \"CSV UTF-8\")") from error
    except OSError as error:
        raise DatasetError(f"{path}: the splits record cannot be read ({error.strerror or error})") from error


def _rows(path: Path, reader: Iterable[list[str]]) -> dict[str, Placed]:
    header = next(iter(reader), None)
    if header not in (COLUMNS, FIRST_COLUMNS):
        raise DatasetError(f"{path}: not a splits record (its first line is not {','.join(COLUMNS)}); "
                           "move it away to draw the splits again")
    record = {}
    for number, row in enumerate(reader, start=2):
        if len(row) != len(header) or row[1] not in ("train", "val", "test"):
            raise DatasetError(f"{path}: line {number} is not {','.join(header)}")
        stat = None
        if len(row) == len(COLUMNS) and row[4].lstrip("-").isdigit() and row[5].lstrip("-").isdigit():
            stat = (int(row[4]), int(row[5]))
        record[row[0]] = Placed(row[1], row[2], row[3] if len(row) == len(COLUMNS) else "", stat)
    return record


def write_record(path: Path, record: dict[str, Placed]) -> None:
    """The whole record, replaced at once (captioning.runtime.files: a reader never sees half of it;
    ranks that write it at the same time write the same rows)."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(COLUMNS)
    writer.writerows([image, placed.split, placed.given, placed.contents,
                      *(placed.stat if placed.stat is not None else ("", ""))] for image, placed in record.items())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, text.getvalue())
    except OSError as error:
        raise DatasetError(f"{path.parent}: cannot write the splits record there ({error.strerror or error}); "
                           "set data.cache_root to a folder that can hold it") from error


def split_draw(image: str, *, seed: int) -> float:
    """A number in [0, 1) fixed by the image's path and the seed alone: where a made split puts it."""
    digest = hashlib.sha256(f"{seed}/{image}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def assign_splits(given: dict[str, str], kept: dict[str, Placed], *, seed: int, share: float,
                   source: Path, record: Path | None) -> tuple[dict[str, str], list[str]]:
    """Every image's split, from what its rows give (`given`, "" for none) and what the record kept.

    An image the record holds keeps its split, unless its rows now give another than they gave then
    (the captions file edited: the user's word, which `prepare` names). A new image takes the split its
    rows give; without one, the split its own draw falls in, for each split that no row names (val:
    [0, share), test: [share, 2 share), else train). Where no row leaves a split empty, val and test
    are drawn so from the new training rows. A made split left empty (a small collection) takes the
    free new image whose draw comes closest. Returns (splits, the images whose rows moved them)."""
    splits: dict[str, str] = {}
    changed = []
    for image, split in given.items():
        if image in kept:
            kept_split, given_then = kept[image].split, kept[image].given
            edited = bool(split) and split not in (given_then, kept_split)
            if edited:
                changed.append(image)
            splits[image] = split if edited else kept_split
        elif split:
            splits[image] = split
    named = set(given.values())
    missing = [s for s in ("val", "test") if s not in named]
    fresh = [image for image in given if image not in kept]
    drawn_from = "" if "" in named else "train"  # the images without a split, or else the training ones
    pool = [image for image in fresh if given[image] == drawn_from]
    if missing and not kept and len(pool) < len(missing) + 1:
        raise DatasetError(f"{source}: too few images to make the {' and '.join(missing)} split from "
                           f"({len(pool)}); give some rows a split")
    free = set(pool)
    draws = {image: split_draw(image, seed=seed) for image in pool}
    for order, split in enumerate(missing):
        low, high = order * share, (order + 1) * share
        chosen = [image for image in pool if image in free and low <= draws[image] < high]
        if not chosen and split not in splits.values():  # a small collection: at least one image
            candidates = [image for image in pool if image in free]
            if not candidates:
                raise DatasetError(f"{source}: no row names a {split} split and the splits record {record} holds "
                                   f"none of these images in it; give some rows split {split}, or move the record "
                                   "away to draw the splits again (an image trained on may then be tested on)")
            chosen = [min(candidates, key=lambda image: abs(draws[image] - low))]
        for image in chosen:
            splits[image] = split
            free.discard(image)
    for image in fresh:
        splits.setdefault(image, "train")
    if not any(split == "train" for split in splits.values()):
        raise DatasetError(f"{source}: no training images (every row's split is val or test)")
    return {image: splits[image] for image in given}, changed


@dataclass
class Assigned:
    """Every image's split, placed photo by photo (`assign_by_contents`), and why some were placed so."""

    splits: dict[str, str]
    made: dict[str, list[str]]  # split -> the images the seed put there, now or when first placed
    edited: dict[str, tuple[str, str]]  # images whose rows moved them: (kept, now)
    copies: dict[str, str]  # image -> the image whose contents it repeats, and whose split it shares
    rejoined: dict[str, tuple[str, str]]  # images the record kept apart from their copies: (kept, now)


def assign_by_contents(given: dict[str, str], kept: dict[str, Placed], contents: dict[str, str], *, seed: int,
                       share: float, source: Path, record: Path | None) -> Assigned:
    """`assign_splits` over photos, not names: the images whose files hold the same bytes are one
    photo with one split, or a copy of a test photo would be trained on. Each photo is placed as the
    record placed it, or else as the first of its names in the captions file would be; its rows'
    splits together are the photo's. Rows that give one photo two splits are refused in one line. A photo the record
    kept in two splits (copies placed apart before copies were known) goes to the first of train,
    val, test that holds a copy: any run may have trained on it there, so the held-out splits lose
    the copy rather than keep what was trained on. `contents` is each image's digest ("" unknown)."""
    photos: dict[str, list[str]] = {}
    for image in given:  # an image without contents (missing, unreadable) is a photo of its own
        photos.setdefault(contents.get(image) or f"name:{image}", []).append(image)
    apart = [members for members in photos.values() if len({given[m] for m in members} - {""}) > 1]
    if apart:
        named = "; ".join(", ".join(f"{m}: {given[m]}" for m in members if given[m]) for members in apart[:3])
        more = "; ..." if len(apart) > 3 else ""
        raise DatasetError(f"{source}: {len(apart)} photo{'s' if len(apart) > 1 else ''} under several names with "
                           f"the same contents given two splits by their rows ({named}{more}); a copy of a photo "
                           "shares its split: give them one")
    first = {}  # each photo's image that stands for it: a recorded one, else the first the file names
    for members in photos.values():
        held = [m for m in members if m in kept]
        first[members[0]] = min(held, key=lambda m: SPLITS.index(kept[m].split)) if held else members[0]
    photo_given = {first[ms[0]]: next((given[m] for m in ms if given[m]), "") for ms in photos.values()}
    photo_kept = {image: kept[image] for image in photo_given if image in kept}
    placed, changed = assign_splits(photo_given, photo_kept, seed=seed, share=share, source=source, record=record)
    assigned = Assigned(splits={}, made={}, edited={}, copies={}, rejoined={})
    for members in photos.values():
        image = first[members[0]]
        split = placed[image]
        if split not in (photo_given[image], photo_kept[image].given if image in photo_kept else ""):
            assigned.made.setdefault(split, []).extend(members)  # the seed's choice, now or then
        for member in members:
            assigned.splits[member] = split
            if member != image:
                assigned.copies[member] = image
            if member in kept and kept[member].split != split:
                moves = assigned.edited if image in changed else assigned.rejoined
                moves[member] = (kept[member].split, split)
    assigned.splits = {image: assigned.splits[image] for image in given}
    return assigned


@dataclass
class Recalled:
    """What the record says of the images a captions file names now."""

    kept: dict[str, Placed]  # the record's rows, and those of images moved since under their new names
    recorded: dict[str, Placed]  # the record's rows as its file holds them (none where taken from another)
    now: dict[str, Placed]  # each image's contents and stat now (its split and given not yet known)
    moved: dict[str, str] = field(default_factory=dict)  # new name -> the recorded image with its contents
    replaced: list[str] = field(default_factory=list)  # recorded names whose file holds contents no row knows
    gone: list[str] = field(default_factory=list)  # recorded photos neither under their name nor found by contents
    adopted: tuple[Path, int] | None = None  # another record these images' splits were taken from, and how many


def recall(path: Path | None, images: list[str], *, image_root: Path, dataset_own: Path | None = None) -> Recalled:
    """The record at `path` (None: none kept) read for `images` (keys relative to image_root): each
    image's digest, hashed only where its size or time changed since it was recorded; images not in
    the record under their name but under their contents (moved, renamed, copied); and, where there
    is no record yet, the splits of the record that holds most of these images among those beside it
    and `dataset_own` (the record in the dataset's own folder, which its owner's runs keep: a user of
    a shared dataset keeps a record of their own under data.cache_root, and starts from the owner's)."""
    kept = recorded = read_record(path) if path is not None else {}
    shared = _shared_stats(kept)
    now = {}
    for image in images:
        stat = file_stat(image_root / image)
        known = kept.get(image)
        if stat is None:  # missing: `prepare` names it; it has no contents to be known by
            contents = ""
        elif known is not None and known.contents and known.stat == stat and stat not in shared:
            contents = known.contents
        else:
            contents = file_digest(image_root / image) or ""
        now[image] = Placed("", "", contents, stat)
    adopted = None
    if path is not None and not kept:
        kept, adopted = _adopt(path, now, dataset_own=dataset_own)
    by_contents: dict[str, list[str]] = {}
    for image, placed in kept.items():
        if placed.contents:
            by_contents.setdefault(placed.contents, []).append(image)
    named = set(images)

    def still_holds(image: str) -> bool:  # a recorded name that still holds the contents recorded for it
        return image in named and now[image].contents == kept[image].contents

    moved, replaced = {}, []
    for image in images:
        contents, held = now[image].contents, kept.get(image)
        if not contents or held is not None and held.contents in ("", contents):
            continue  # its own row: the name holds what it held (or there are no contents to tell by)
        sources = by_contents.get(contents, [])
        if sources:  # another photo renamed or copied onto this name: its split follows its contents
            moved[image] = min(sources, key=lambda source: (still_holds(source), source))
        elif held is not None:  # contents no record row knows, under a recorded name: the photo edited
            replaced.append(image)
    present = {image for image in images if image in kept and image not in moved} | set(moved.values())
    gone = [image for image in kept if image not in present]
    return Recalled(kept={**kept, **{image: kept[source] for image, source in moved.items()}}, recorded=recorded,
                    now=now, moved=moved, replaced=replaced, gone=gone, adopted=adopted)


def _shared_stats(kept: dict[str, Placed]) -> set[tuple[int, int]]:
    """The (size, time) pairs that several recorded files share (a fixed-size format unpacked from an
    archive that keeps whole seconds): such a pair does not tell which file is at a name, so a swap
    between two of them would pass unhashed. Their files are hashed at every read."""
    counted = Counter(placed.stat for placed in kept.values() if placed.stat is not None)
    return {stat for stat, count in counted.items() if count > 1}


def _adopt(path: Path, now: dict[str, Placed], *,
           dataset_own: Path | None) -> tuple[dict[str, Placed], tuple[Path, int] | None]:
    """The rows of the record (beside `path`, or the dataset's own) that places most of these images
    (by contents; by name in a record that kept no contents), under these images' names."""
    best: tuple[dict[str, Placed], tuple[Path, int] | None] = ({}, None)
    own = [dataset_own] if dataset_own is not None and dataset_own != path and dataset_own.is_file() else []
    for other in [*own, *other_records(path)]:
        try:
            rows = read_record(other)
        except DatasetError:  # another dataset's record that cannot be read is not this one's to fix
            continue
        by_contents = {placed.contents: placed for placed in rows.values() if placed.contents}
        taken = {}
        for image, placed in now.items():
            if placed.contents and placed.contents in by_contents:
                taken[image] = by_contents[placed.contents]
            elif image in rows and not rows[image].contents:
                taken[image] = rows[image]
        if len(taken) > (best[1][1] if best[1] else 0):
            best = (taken, (other, len(taken)))
    return best


def other_records(path: Path) -> list[Path]:
    """The records beside `path` for a captions file of the same name, seed and share: other
    datasets', this one's before it moved, and one named before records carried their dataset's digest."""
    named = _NAME.fullmatch(path.name)
    if named is None or not path.parent.is_dir():  # a record not named by record_path has no kin
        return []
    pattern = re.compile(re.escape(named["captions"]) + r"(\.[0-9a-f]{12})?\." + re.escape(named["tail"]))
    return sorted(other for other in path.parent.iterdir()
                  if other != path and pattern.fullmatch(other.name) and other.is_file())


# record_path's names: the captions file's, its dataset's digest (under a cache root), the seed and share
_NAME = re.compile(r"(?P<captions>.+?)(\.[0-9a-f]{12})?\.(?P<tail>seed-?\d+\.share[^/]+\.csv)")
