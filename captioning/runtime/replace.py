"""Files replaced whole: written beside their final name under a name of their own, then renamed.

A reader never sees half a file and a kill never leaves one. The temporary's name is unique to the
write, because two processes may write the same file at once (two runs sharing one feature cache,
ranks writing a dataset's split record): with one shared temporary name, the first rename took the
other's file away mid-write and the second process failed. Each now renames its own whole file; the
last rename wins, and both wrote the same thing.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def temporary_beside(path: Path) -> Path:
    """A fresh hidden name in `path`'s folder, for this one write."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` whole, readable by whoever the umask lets read (a tempfile-module file
    would be its owner's alone: other users of a shared cache could not read it). An OSError
    (a read-only folder, a full disk) leaves `path` as it was and no temporary behind."""
    temporary = temporary_beside(path)
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(descriptor, "w", newline="", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise
