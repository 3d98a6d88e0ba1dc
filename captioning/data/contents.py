"""What an image file holds, as a digest of its bytes: the identity that survives a move, a rename or a
copy (a path does not), and that changes when the picture does (a name does not).

The splits record (data/kept_splits.py) keeps each image's digest beside its path, so that a photo
moved into another folder keeps its split; the feature cache (data/features.py) keeps each row's, so
that a dataset copied or moved is not encoded again and an image replaced under its own name is; a
checkpoint's record (train/provenance.py) keeps one per split, so that `captioning verify` can tell
changed images from the hardware. SHA-256 runs at about 2 GB/s on one core, so a file is hashed
when it is new or its size or modification time changed, never at every read (docs/reliability.md
gives the cost at COCO's size).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

DIGEST_CHARS = 32  # 128 bits of SHA-256: no two of a few million photos share one by chance


def file_digest(path: str | Path) -> str | None:
    """The digest of a file's bytes, or None where it cannot be read (missing, a folder, no permission)."""
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()[:DIGEST_CHARS]
    except OSError:
        return None


def file_stat(path: str | Path) -> tuple[int, int] | None:
    """(size, modification time in ns) of a file, None where it cannot be seen: what says, without
    reading it, that a file is as it was when its digest was taken."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns


def contents_of(paths: Sequence[str | Path], known: Sequence[str | None] | None = None) -> list[str | None]:
    """Each file's digest: `known` where a feature cache already took them, else hashed here."""
    return list(known) if known is not None else [file_digest(path) for path in paths]


def split_digest(contents: Sequence[str | None]) -> str:
    """16 hex digits for a split's images' contents in their order (a missing file counts as "-")."""
    hashed = hashlib.sha256()
    for digest in contents:
        hashed.update(f"{digest or '-'}\n".encode())
    return hashed.hexdigest()[:16]
