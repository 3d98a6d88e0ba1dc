"""One run per folder: the process that trains into train.out_dir holds OUT_DIR/.run.lock.

A second run into the same folder would write over the first one's checkpoints (two processes
renaming the same temporary file); it stops at once with one line instead. The lock is an flock,
which the system releases when its process ends however it ends, so `--resume` after a kill takes
the folder over.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from captioning.train.step import TrainingError


@contextmanager
def run_folder(out_dir: str | Path, *, enabled: bool = True) -> Iterator[None]:
    """Hold OUT_DIR/.run.lock for the block (only where `enabled`: the process that writes)."""
    if not enabled:
        yield
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(out / ".run.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        owner = (out / ".run.pid").read_text().strip() if (out / ".run.pid").exists() else "another process"
        raise TrainingError(f"{out}: another run is training into this folder (process {owner}); choose "
                            "another train.out_dir or wait for it to end") from None
    try:
        (out / ".run.pid").write_text(f"{os.getpid()}\n")
        yield
    finally:
        lock.release()
