"""The feature cache: a frozen encoder's output, computed once per image and stored as fp16.

Notation: N images, L grid cells, D channels.

With a frozen encoder the annotations of an image never change, so recomputing them every epoch
is pure waste: the cache makes an epoch a decoder-only pass (docs/benchmarks.md has the measured
speed-up). Each split is one .npy array [N, L, D] (memory-mapped when read, so it need not fit in
RAM) plus a small JSON naming the image ids, the grid and the rows whose image could not be read;
a cache made for another list of images is recomputed.

A cache knows what made it and checks itself, cheaply, each time it is opened:
  - its folder is named after the encoder, layer, size, padding and the weights' content
    (data/splits.py: features_dir);
  - the JSON records each image's size and modification time; images changed since are encoded
    again, in place (the cache then holds what a fresh build would, at the price of those images
    only), and the run says which;
  - the JSON holds a BLAKE2 digest per block of about 4 MB; on open, the file's size and a sample of
    blocks (the first, the last and six at random) are checked, and a damaged cache is reported in
    one line and rebuilt, never read (docs/reliability.md measures the cost).

Writing goes into a preallocated memory-mapped `.SPLIT.partial.npy` with a progress marker
(`.SPLIT.progress.json`, the number of rows done, replaced atomically after the rows are flushed):
an interrupted run (COCO's 123 287 images take a while) resumes at the first row not yet done.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from filelock import FileLock
from PIL import Image
from torch.utils.data import DataLoader

from captioning.data.images import ImageFiles, ImageReadError, Resolver, collate_pixels, file_digest, warn_unreadable
from captioning.data.records import DatasetError, ImageRecord, counted, first_names
from captioning.model.encoder import Encoder
from captioning.progress import bar as progress_bar
from captioning.runtime.files import replace_text


class Cached(NamedTuple):
    annotations: np.ndarray  # [N, L, D] fp16, memory-mapped
    grid: tuple[int, int]  # (Hg, Wg)
    unreadable: list[int]  # rows whose image could not be read (their annotations are zeros)
    contents: list[str | None] | None = None  # each row's image file's digest (data/images.py)


def cache_dir(root: str | Path, *, encoder: str, layer: str, image_size: int, weights: str,
              padding: str = "zeros") -> Path:
    """ROOT/features/ENCODER-LAYER-SIZE-wWEIGHTS[-pad_PADDING]: everything that changes the annotations
    is in the name, the weights by their content (captioning.model.encoder.weights_identity), so
    that two weight files called the same never share a cache."""
    tag = f"{encoder}-{layer}-{image_size}-w{weights}" + ("" if padding == "zeros" else f"-pad_{padding}")
    return Path(root) / "features" / tag


BLOCK_BYTES = 1 << 22  # checksum granularity: about 4 MB of rows
SAMPLED_BLOCKS = 6  # checked at random on each open, besides the first and the last


def _paths(records: list[ImageRecord]) -> list[str]:
    """Each row's image file, resolved: two rows whose files swap places (cp -p and unzip keep size
    and time) are changed rows, though each file's size and time are as cached."""
    resolve = Resolver()
    return [resolve(record.path) for record in records]


def _stats(records: list[ImageRecord]) -> list[list[int] | None]:
    """Each image file's [size, modification time in ns], None where it cannot be seen."""
    stats: list[list[int] | None] = []
    for record in records:
        try:
            status = os.stat(record.path)
            stats.append([status.st_size, status.st_mtime_ns])
        except OSError:
            stats.append(None)
    return stats


def _block_rows(array: np.ndarray) -> int:
    return max(1, BLOCK_BYTES // max(1, array[0].nbytes if len(array) else 1))


def _digests(array: np.ndarray, blocks: list[int] | None = None) -> dict[int, str]:
    rows = _block_rows(array)
    count = (len(array) + rows - 1) // rows
    chosen = range(count) if blocks is None else blocks
    return {b: hashlib.blake2b(np.ascontiguousarray(array[b * rows:(b + 1) * rows]).tobytes(), digest_size=16)
            .hexdigest() for b in chosen}


def _damage(array_path: Path, meta: dict) -> str | None:
    """Why the finished cache at array_path is not what was written, or None: its size and a sample
    of its blocks against the digests recorded when it was finished."""
    digests = meta.get("digests")
    if not digests:
        return "it has no checksums (made before caches carried them)"
    try:
        array = np.load(array_path, mmap_mode="r")
    except (OSError, ValueError) as error:
        return f"cannot be opened ({error})"
    if list(array.shape) != meta.get("shape"):
        return f"its shape is {list(array.shape)}, not {meta.get('shape')}"
    expected = array.offset + array.nbytes if hasattr(array, "offset") else None
    if expected is not None and array_path.stat().st_size != expected:
        return f"its size is {array_path.stat().st_size} bytes, not {expected}"
    count = len(digests)
    sample = sorted({0, count - 1, *random.sample(range(count), min(SAMPLED_BLOCKS, count))})
    for block, digest in _digests(array, sample).items():
        if digest != digests[block]:
            return f"block {block} of {count} does not match its checksum"
    return None


def _fingerprint(ids: list[int]) -> str:
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()


def _write_json(path: Path, value: dict) -> None:
    replace_text(path, json.dumps(value))


@torch.no_grad()
def write_cache(directory: Path, split: str, records: list[ImageRecord], **options) -> Cached:
    """Compute the annotations of a split into DIRECTORY/SPLIT.npy, resuming an interrupted run
    (options: those of _write_cache). A full disk or a file-size limit is one line: the rows written
    so far stay, and the next run goes on from them."""
    try:
        return _write_cache(directory, split, records, **options)
    except OSError as error:
        raise DatasetError(f"{directory}: the {split} feature cache could not be written "
                           f"({error.strerror or error}); free some space and run again: it goes on where it "
                           "stopped") from error


def check_free_space(directory: Path, split: str, *, images: int, cells: int, channels: int) -> None:
    """Refuse, before any image is encoded, a cache that the disk under `directory` cannot hold: one
    line with the size it needs (images x cells x channels x 2 bytes, fp16) and the space free."""
    need = images * cells * channels * 2
    free = shutil.disk_usage(directory).free
    if need > free:
        raise DatasetError(f"{directory}: the {split} feature cache needs {_size(need)} ({images} images x {cells} "
                           f"cells x {channels} channels x 2 bytes) and {_size(free)} is free there; free some "
                           "space, or set data.cache_root to a disk with room")


def _size(count: int) -> str:
    return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"


def _reserve(path: Path) -> None:
    """Allocate the whole file now, so that a disk too small says so here, not later as a crash
    when a memory-mapped page cannot be written back."""
    with open(path, "r+b") as file:
        os.posix_fallocate(file.fileno(), 0, os.fstat(file.fileno()).st_size)


@torch.no_grad()
def _write_cache(directory: Path, split: str, records: list[ImageRecord], *, encoder: Encoder, image_size: int,
                batch_size: int = 32, device: str | torch.device = "cpu", num_workers: int = 0,
                transform: Callable[[Image.Image], Image.Image] | None = None) -> Cached:
    """The work of write_cache.

    `transform`: the annotations of the images changed first (data/flips.py: flipped, under a
    SPLIT name of their own, train_mirrored)."""
    directory.mkdir(parents=True, exist_ok=True)
    partial, marker = directory / f".{split}.partial.npy", directory / f".{split}.progress.json"
    made_of = directory / f".{split}.partial.json"  # the files the partial rows were encoded from, as they were
    ids = [r.image_id for r in records]
    stats, paths = _stats(records), _paths(records)  # before reading: an image changed while encoded counts as changed
    contents = [file_digest(record.path) for record in records]  # the same: before the pixels are read
    ready = marker.exists() and partial.exists() and made_of.exists()
    progress = json.loads(marker.read_text()) if ready else None
    if progress is not None and progress.get("fingerprint") != _fingerprint(ids):
        progress = None  # another list of images: start over
    out = np.lib.format.open_memmap(partial, mode="r+") if progress is not None else None
    done = progress["done"] if progress is not None else 0
    if progress is not None:
        # The rows done were encoded from the files as they were then: recorded so, an image changed
        # since (while the run was stopped) differs from the cache's record, and refresh_changed, run
        # on the finished cache below, encodes it again.
        earlier = json.loads(made_of.read_text())
        stats[:done], paths[:done], contents[:done] = (earlier[key][:done] for key in ("stats", "paths", "contents"))
    unreadable: list[int] = progress["unreadable"] if progress is not None else []
    grid: tuple[int, int] = tuple(progress["grid"]) if progress is not None else (0, 0)
    encoder = encoder.to(device).eval()
    if out is None:  # a fresh cache: its size, from one blank image, before any image is read
        blank, _ = encoder(torch.zeros(1, 3, image_size, image_size, device=device))  # [1, L, D]
        check_free_space(directory, split, images=len(records), cells=blank.shape[1], channels=blank.shape[2])
    images = ImageFiles(records, size=image_size, mean=encoder.mean, std=encoder.std, first=done, transform=transform)
    loader = DataLoader(images, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_pixels,
                        pin_memory=torch.device(device).type == "cuda")
    for batch in progress_bar(loader, desc=f"{split} features", unit="batch", leave=False):
        unreadable += [row for row, _ in batch.failures]  # named once, when the split is loaded
        if batch.pixels is not None:
            annotations, grid = encoder(batch.pixels.to(device, non_blocking=True))  # [b, L, D]
            annotations = annotations.to(torch.float16).cpu().numpy()
            if out is None:  # the first batch tells the shape [N, L, D]
                # A marker left by a run killed as it finished would pair with this new partial file, and
                # a later resume would take rows never encoded for done: it goes first.
                marker.unlink(missing_ok=True)
                _write_json(made_of, {"stats": stats, "paths": paths, "contents": contents})
                out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float16,
                                                shape=(len(records), *annotations.shape[1:]))
                _reserve(partial)
            out[batch.rows] = annotations
        done += len(batch.rows) + len(batch.failures)
        if out is not None:  # rows first, then the marker that says they are there
            out.flush()
            _write_json(marker, {"fingerprint": _fingerprint(ids), "done": done, "grid": list(grid),
                                 "unreadable": unreadable})
    if out is None:
        raise ImageReadError(f"{split}: none of the {len(records)} images could be read")
    out[unreadable] = 0
    out.flush()
    meta = {"image_ids": ids, "grid": list(grid), "unreadable": sorted(unreadable), "shape": list(out.shape),
            "stats": stats, "paths": paths, "contents": contents,
            "digests": [d for _, d in sorted(_digests(out).items())]}
    del out
    array_path = directory / f"{split}.npy"
    marker.unlink()  # before the partial file goes: a marker never outlives the file it describes
    os.replace(partial, array_path)
    _write_json(directory / f"{split}.json", meta)
    made_of.unlink()
    cached = Cached(np.load(array_path, mmap_mode="r"), grid, sorted(unreadable), contents)
    if progress is None:  # every row encoded now, from the files as they were recorded
        return cached
    return refresh_changed(directory, split, records, cached, encoder_factory=lambda: encoder, image_size=image_size,
                           batch_size=batch_size, device=device, transform=transform)


def read_cache(directory: Path, split: str, records: list[ImageRecord]) -> Cached | None:
    """The complete cache of a split for exactly these images, memory-mapped; None if there is none,
    or if it is damaged (said in one line, and removed so that it is rebuilt)."""
    array_path, meta_path = directory / f"{split}.npy", directory / f"{split}.json"
    if not (array_path.exists() and meta_path.exists()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        meta = {}
    if meta and meta.get("image_ids") != [r.image_id for r in records]:
        return None
    problem = _damage(array_path, meta) if meta else "its description cannot be read"
    if problem is not None:
        try:
            array_path.unlink()
            meta_path.unlink()
        except OSError as error:  # a read-only dataset mount: the damaged file stays, and is not read
            raise DatasetError(f"{array_path}: damaged, {problem}; it cannot be removed to be rebuilt there "
                               f"({error.strerror or error}): set data.cache_root to a folder that can hold a new "
                               "cache") from error
        print(f"warning: {array_path}: damaged, {problem}; rebuilding it", file=sys.stderr)
        return None
    return Cached(np.load(array_path, mmap_mode="r"), tuple(meta["grid"]), list(meta.get("unreadable", [])),
                  meta.get("contents"))


def refresh_changed(directory: Path, split: str, records: list[ImageRecord], cached: Cached, *,
                    encoder_factory: Callable[[], Encoder], image_size: int, batch_size: int = 32,
                    device: str | torch.device = "cpu",
                    transform: Callable[[Image.Image], Image.Image] | None = None) -> Cached:
    """The complete cache `cached`, brought up to date with the image files: rows whose file's size or
    modification time changed since, or whose row now names another file, are hashed; those whose
    bytes changed (or that a cache made before caches kept contents cannot tell) are encoded again,
    in place, with their checksums; those with the same bytes (the dataset copied or moved, a file
    touched) only get their new stat recorded. Where the cache cannot be written (a read-only data.root
    holding a cache), the rows encoded again are kept in memory for this run, and it says so.
    A cache made before caches kept their paths or contents takes the present ones as its own."""
    array_path, meta_path = directory / f"{split}.npy", directory / f"{split}.json"
    meta = json.loads(meta_path.read_text())
    now, paths = _stats(records), _paths(records)
    kept_paths = meta.get("paths", paths)
    moved = [row for row, (old, new, was, path) in enumerate(zip(meta["stats"], now, kept_paths, paths))
             if old != new or was != path]
    kept_contents = meta.get("contents")
    contents = list(kept_contents) if kept_contents is not None else [file_digest(r.path) for r in records]
    for row in moved if kept_contents is not None else ():
        contents[row] = file_digest(records[row].path)
    changed = [row for row in moved if kept_contents is None or contents[row] != kept_contents[row]
               or contents[row] is None]
    described = {**meta, "stats": now, "paths": paths, "contents": contents}
    if described == meta:
        return cached._replace(contents=contents)
    if changed:
        names = first_names([records[row].path for row in changed])
        print(f"note: {split}: {counted(len(changed), 'image')} changed since the cache was made ({names}), "
              "encoded again", file=sys.stderr)
    encoding = {"encoder_factory": encoder_factory, "image_size": image_size, "batch_size": batch_size,
                "device": device, "transform": transform}
    try:
        _check_writable(directory)
        annotations = np.lib.format.open_memmap(array_path, mode="r+") if changed else None
    except OSError as error:  # a read-only data.root: this run's copy of the changed rows, in memory
        return _refreshed_in_memory(directory, split, records, cached, changed, moved, contents, error, **encoding)
    unreadable = _encode_rows(annotations, records, changed, set(meta["unreadable"]), **encoding)
    if annotations is not None:
        annotations.flush()
        blocks = sorted({row // _block_rows(annotations) for row in changed})
        digests = list(meta["digests"])
        for block, digest in _digests(annotations, blocks).items():
            digests[block] = digest
        described.update(digests=digests)
        del annotations
    _write_json(meta_path, {**described, "unreadable": sorted(unreadable)})
    fresh = read_cache(directory, split, records)
    return fresh._replace(contents=contents) if fresh is not None else cached


def _check_writable(directory: Path) -> None:
    """Raise the OSError that writing into `directory` meets (a read-only mount, no rights), if any."""
    # a name of its own (not the process id: two runs may share a process, as threads)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".writable."):
        pass


def _refreshed_in_memory(directory: Path, split: str, records: list[ImageRecord], cached: Cached, changed: list[int],
                         moved: list[int], contents: list[str | None], error: OSError, **encoding) -> Cached:
    """The cache as refresh_changed would have made it, where it cannot be written: the changed rows
    encoded again into a copy-on-write map (the file stays as it was), said in one line."""
    reason = error.strerror or str(error)
    if not changed and not moved:  # only the contents of a cache made before caches kept them: taken here
        return cached._replace(contents=contents)
    if not changed:
        print(f"note: {directory}: {counted(len(moved), 'image')} moved or touched since the cache was made, with "
              f"the same contents; the cache cannot record it ({reason}), so each run hashes them again "
              "(data.cache_root names a folder that can keep an up-to-date cache)", file=sys.stderr)
        return cached._replace(contents=contents)
    print(f"note: {directory}: the cache cannot be updated there ({reason}): "
          f"{counted(len(changed), 'changed image')} encoded again in memory, at each run (data.cache_root names a "
          "folder that can keep an up-to-date cache)", file=sys.stderr)
    annotations = np.load(directory / f"{split}.npy", mmap_mode="c")  # writes stay in this process's memory
    unreadable = _encode_rows(annotations, records, changed, set(cached.unreadable), **encoding)
    return Cached(annotations, cached.grid, sorted(unreadable), contents)


def _encode_rows(out: np.ndarray | None, records: list[ImageRecord], rows: list[int], unreadable: set[int], *,
                 encoder_factory: Callable[[], Encoder], image_size: int, batch_size: int,
                 device: str | torch.device, transform: Callable[[Image.Image], Image.Image] | None) -> set[int]:
    """Encode the images of `rows` into those rows of `out`; returns the unreadable rows as they are now."""
    if out is None or not rows:
        return set(unreadable)
    unreadable = set(unreadable)
    encoder = encoder_factory().to(device).eval()
    images = ImageFiles([records[row] for row in rows], size=image_size, mean=encoder.mean, std=encoder.std,
                        transform=transform)
    for batch in DataLoader(images, batch_size=batch_size, collate_fn=collate_pixels):
        for index, reason in batch.failures:
            warn_unreadable(reason)
            out[rows[index]] = 0
            unreadable.add(rows[index])
        if batch.pixels is not None:
            with torch.no_grad():
                annotations, _ = encoder(batch.pixels.to(device))
            done = [rows[index] for index in batch.rows]
            out[done] = annotations.to(torch.float16).cpu().numpy()
            unreadable -= set(done)
    return unreadable


def load_or_compute(directory: Path, split: str, records: list[ImageRecord], *, encoder_factory: Callable[[], Encoder],
                    image_size: int, batch_size: int = 32, device: str | torch.device = "cpu",
                    num_workers: int = 0, transform: Callable[[Image.Image], Image.Image] | None = None) -> Cached:
    """The cached annotations of a split (memory-mapped), computing and storing them if needed.

    `encoder_factory()` builds the encoder only when something must be computed.
    """
    cached = read_cache(directory, split, records)
    if cached is not None:
        return refresh_changed(directory, split, records, cached, encoder_factory=encoder_factory,
                               image_size=image_size, batch_size=batch_size, device=device, transform=transform)
    # Two runs started at once on the same data would write the same partial file: the second waits,
    # then finds the first one's cache.
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _check_writable(directory)
    except OSError as error:  # a read-only dataset mount: say where the cache can go instead
        raise DatasetError(f"{directory}: the {split} feature cache cannot be written there "
                           f"({error.strerror or error}); set data.cache_root to a folder that can hold it") from error
    with FileLock(directory / f".{split}.lock"):
        cached = read_cache(directory, split, records)
        if cached is not None:
            return cached
        return write_cache(directory, split, records, encoder=encoder_factory(), image_size=image_size,
                           batch_size=batch_size, device=device, num_workers=num_workers, transform=transform)
