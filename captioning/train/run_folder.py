"""A run's folder: one run per folder (the process that trains into train.out_dir holds
OUT_DIR/.run.lock), and what the run logs there (`RunLog`: log.jsonl and TensorBoard).

A second run into the same folder would write over the first one's checkpoints (two processes
renaming the same temporary file); it stops at once with one line instead. The lock is an flock,
which the system releases when its process ends however it ends, so `--resume` after a kill takes
the folder over.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from torch.utils.tensorboard import SummaryWriter

from captioning.runtime.files import replace_text
from captioning.train.objective import TrainingError


@contextmanager
def run_folder(out_dir: str | Path, *, resume: bool, enabled: bool = True) -> Iterator[None]:
    """Hold OUT_DIR/.run.lock for the block (only where `enabled`: the process that writes). A new run
    (not `resume`) into a folder that holds another run's checkpoints is refused: its first
    validation would replace best.pt whatever it measured (the first best is any number), and it
    would empty log.jsonl, so a job started again without --resume lost the run it was to go on with."""
    if not enabled:
        yield
        return
    out = Path(out_dir)
    lock = FileLock(out / ".run.lock")
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:
        owner = (out / ".run.pid").read_text().strip() if (out / ".run.pid").exists() else "another process"
        raise TrainingError(f"{out}: another run is training into this folder (process {owner}); choose "
                            "another train.out_dir or wait for it to end") from None
    except OSError as error:  # no rights there, a read-only disk, a file where the folder would be
        raise TrainingError(f"{out}: the run cannot write its folder ({error.strerror or type(error).__name__}); "
                            "choose another train.out_dir") from error
    if not resume:
        try:
            refuse_to_replace_a_run(out)
        except TrainingError:
            lock.release()
            raise
    try:
        (out / ".run.pid").write_text(f"{os.getpid()}\n")
        yield
    finally:
        lock.release()


def refuse_to_replace_a_run(out_dir: str | Path) -> None:
    """A new run's refusal of a folder that holds another run's checkpoints (run_folder; a dry run
    asks too, writing nothing)."""
    out = Path(out_dir)
    held = [name for name in ("last.pt", "best.pt") if (out / name).exists()]
    # best.pt alone: a run stopped between its first two saves (best.pt is written first), nothing to resume
    go_on = "go on with it with --resume, or " if "last.pt" in held else "it has no last.pt to resume from: "
    if held:
        raise TrainingError(f"{out}: holds a run ({' and '.join(held)}) that a new run would replace: {go_on}start "
                            "again in another train.out_dir (or remove this one)")


# what a run logs in its folder --------------------------------------------------------------------
# What a run writes as it goes: TensorBoard events and OUT_DIR/log.jsonl (one JSON object per line).
#
# Only the main process writes. A resumed run writes again what happened after its checkpoint, so
# both logs are first cut back to the checkpoint's step: nothing appears twice.

def _step_of(line: str) -> float:
    """The step of a log line; a line torn by a kill mid-write counts as past every checkpoint."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


class RunLog:
    def __init__(self, out: Path, *, resumed_at: int | None):
        """`resumed_at`: the step of the checkpoint the run resumed from (None for a new run)."""
        self.path = out / "log.jsonl"
        # After a kill, events past the checkpoint's step are written again: purge the old ones.
        self.writer = SummaryWriter(str(out / "tensorboard"),
                                    purge_step=resumed_at + 1 if resumed_at is not None else None)
        lines = self.path.read_text().splitlines() if self.path.exists() and resumed_at else []
        kept = [line for line in lines if _step_of(line) <= (resumed_at or 0)]
        replace_text(self.path, "".join(f"{line}\n" for line in kept))  # whole: a kill here keeps the old log
        self.stopped = False
        # TensorBoard's writer thread keeps an error it meets and raises it again at the next write (or
        # the close), where `write` says it in one line; the thread's own traceback would come first.
        self.hook = threading.excepthook
        threading.excepthook = lambda args: None if (type(args.thread).__name__ == "_AsyncWriterThread"
                                                     and isinstance(args.exc_value, OSError)) else self.hook(args)

    def write(self, what: Callable[[SummaryWriter], Any]) -> None:
        """One write to the logs, `what(writer)`. A disk that fills or refuses them stops the logging,
        in one line, not the run: what must be kept is its checkpoints, whose save says whether they
        fit (it was a traceback, before the validation's checkpoint was tried)."""
        if self.stopped:
            return
        try:
            what(self.writer)
        except OSError as error:
            self._stop(error)

    def _stop(self, error: OSError) -> None:
        if not self.stopped:
            self.stopped = True
            print(f"note: {self.path.parent}: the run's logs (log.jsonl, tensorboard/) are written no more "
                  f"({error.strerror or error.__class__.__name__}); training goes on", file=sys.stderr)

    def _line(self, entry: dict[str, Any]) -> None:  # one write per line, flushed at once
        with self.path.open("a") as file:
            file.write(json.dumps(entry) + "\n")

    def losses(self, *, step: int, epoch: int, losses: dict[str, float], lrs: list[float], skipped: int) -> None:
        def write(writer: SummaryWriter) -> None:
            for name, number in losses.items():
                writer.add_scalar(f"train/{name}", number, step)
            writer.add_scalar("train/lr", lrs[0], step)
            if len(lrs) > 1:
                writer.add_scalar("train/lr_encoder", lrs[1], step)
            writer.add_scalar("data/skipped_images", skipped, step)
            self._line({"step": step, "epoch": epoch, **losses, "lr": lrs, "skipped_images": skipped})

        self.write(write)

    def validation(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        def write(writer: SummaryWriter) -> None:
            for name, number in metrics.items():
                writer.add_scalar(f"val/{name}", number, step)
            self._line({"step": step, "epoch": epoch, "validation": metrics})

        self.write(write)

    def close(self) -> None:
        try:
            self.writer.close()
        except OSError as error:  # what it could not write: said when the logging stopped, or now
            self._stop(error)
        finally:
            threading.excepthook = self.hook
