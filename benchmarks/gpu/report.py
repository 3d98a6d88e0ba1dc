"""What benchmarks/gpu/gpu.py writes, and how a part reports to it.

One row per case: measured ("ok", with its numbers), "failed" with its cause, or "not run" and why.
The command keeps every row in DIR/gpu.json and a readable table in DIR/gpu.md, both written again
after every row, so that a run cut short still leaves what it measured. A part runs in its own
process and appends its rows, one JSON line each, to a file that the command reads as they come
(`Cases`); it first names the cases it plans, so that cases it never reached still get a row.

This module imports nothing from the package: the command reads it before its set-up has made the
package importable.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OK, FAILED, NOT_RUN = "ok", "failed", "not run"
# Captions in an epoch: Karpathy's train + restval (the COCO configs' data.dataset=coco), and COCO's
# own train2014 alone (data.dataset=coco_official).
COCO_CAPTIONS, TRAIN2014_CAPTIONS = 566_747, 414_113


@dataclass
class Row:
    part: str
    case: str
    status: str  # OK, FAILED or NOT_RUN
    cause: str = ""  # why it failed or did not run; empty for a measured case
    values: dict[str, Any] = field(default_factory=dict)  # its numbers and notes


class NotRun(Exception):
    """A case that cannot run here, and why (one GPU where several are needed, a path that is not there)."""


def cause_of(error: BaseException) -> str:
    """One line: the exception's type and the first line of its message, and where it was raised."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {message}"[:400] + where


# ----------------------------------------------------------------------------------------------- a part's side

class Cases:
    """A part's cases, run one at a time in the part's process: each case's row is appended to
    `rows` (a JSON line) as soon as it is known; past `deadline` (time.monotonic()) the remaining
    cases are rows "not run"."""

    def __init__(self, part: str, rows: Path, *, deadline: float, cleanup: Callable[[], None] = lambda: None):
        self.part, self.rows, self.deadline, self.cleanup = part, rows, deadline, cleanup

    def _write(self, entry: dict[str, Any]) -> None:
        with self.rows.open("a") as file:
            file.write(json.dumps(entry) + "\n")
            file.flush()
            os.fsync(file.fileno())

    def plan(self, cases: list[str]) -> None:
        """The cases this part means to run, in order: any it does not reach still gets a row (found
        by its name, so each name once)."""
        if len(set(cases)) != len(cases):
            raise ValueError(f"{self.part}: a case is named twice in {cases}")
        self._write({"plan": list(cases)})

    def emit(self, row: Row) -> None:
        self._write({"row": asdict(row)})

    def run(self, case: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """`measure()`'s numbers as an "ok" row; an exception as a "failed" row with its cause
        (NotRun: "not run"); past the deadline, "not run" without calling it. Returns the numbers."""
        if time.monotonic() > self.deadline:
            self.emit(Row(self.part, case, NOT_RUN, "the part's time was spent before this case"))
            return None
        try:
            values = measure()
        except NotRun as why:
            self.emit(Row(self.part, case, NOT_RUN, str(why)))
            return None
        except Exception as error:  # noqa: BLE001 - every failure is a row with its cause, never a crash
            self.emit(Row(self.part, case, FAILED, cause_of(error)))
            self.cleanup()
            return None
        self.emit(Row(self.part, case, OK, values=values))
        return values


def read_rows(path: Path, seen: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete lines of a rows file after the first `seen`, and how many complete lines it has."""
    if not path.exists():
        return [], seen
    lines = path.read_text().split("\n")[:-1]  # a last line without its newline is still being written
    return [json.loads(line) for line in lines[seen:]], len(lines)


# ----------------------------------------------------------------------------------------------- the command's side

UNITS = {  # value key: how the table prints it
    "captions_per_s": "{:,.0f} captions/s", "images_per_s": "{:,.1f} images/s", "step_ms": "{:.1f} ms/step",
    "peak_gpu_mib": "peak GPU {:,.0f} MiB", "coco_epoch_min": "COCO epoch {:.1f} min",
    "train2014_epoch_min": "train2014 {:.1f} min", "seconds": "{:.1f} s",
}


def describe(values: dict[str, Any]) -> str:
    """A row's numbers and notes on one line: the known ones with their units, the others as key value."""
    parts = []
    for key, value in values.items():
        if key in UNITS and isinstance(value, (int, float)):
            parts.append(UNITS[key].format(value))
        elif isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
        elif isinstance(value, (list, tuple)):
            parts.append(f"{key} " + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value))
        else:
            parts.append(f"{key} {value}")
    return "; ".join(parts)


def coco_epochs(captions_per_s: float) -> dict[str, float]:
    """Minutes per COCO epoch at this rate, on Karpathy's train + restval and on train2014 alone."""
    return {"coco_epoch_min": COCO_CAPTIONS / captions_per_s / 60,
            "train2014_epoch_min": TRAIN2014_CAPTIONS / captions_per_s / 60}


class Report:
    """Every row so far, in DIR/gpu.json and DIR/gpu.md, written again after each."""

    def __init__(self, out: Path, header: dict[str, Any]):
        self.out, self.header = out, header
        self.rows: list[Row] = []
        self.parts_s: dict[str, float] = {}  # each part's seconds, set-up first: what plan.py's budgets come from
        self.started = time.monotonic()
        out.mkdir(parents=True, exist_ok=True)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.write()

    def counts(self) -> dict[str, int]:
        return {status: sum(row.status == status for row in self.rows) for status in (OK, FAILED, NOT_RUN)}

    def write(self) -> None:
        elapsed = time.monotonic() - self.started
        document = {"header": self.header, "elapsed_s": round(elapsed, 1), "counts": self.counts(),
                    "parts_s": {part: round(seconds, 1) for part, seconds in self.parts_s.items()},
                    "rows": [asdict(row) for row in self.rows]}
        _replace(self.out / "gpu.json", json.dumps(document, indent=1) + "\n")
        _replace(self.out / "gpu.md", self.table(elapsed))

    def table(self, elapsed: float) -> str:
        header = "  \n".join(f"{key}: {value}" for key, value in self.header.items())
        counts = ", ".join(f"{n} {status}" for status, n in self.counts().items())
        parts = ", ".join(f"{part} {seconds:.0f} s" for part, seconds in self.parts_s.items())
        lines = [f"# benchmarks/gpu/gpu.py\n\n{header}  \nelapsed: {elapsed:.0f} s; rows: {counts}  \n"
                 f"parts: {parts or 'none yet'}\n",
                 "| part | case | status | result | cause |", "|---|---|---|---|---|"]
        for row in self.rows:
            cells = [row.part, row.case, row.status, describe(row.values), row.cause]
            lines.append("| " + " | ".join(cell.replace("|", "/").replace("\n", " ") for cell in cells) + " |")
        return "\n".join(lines) + "\n"


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` whole: a reader (or a kill) never sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
