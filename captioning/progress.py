"""Progress for long work (training epochs, decoding a split, caching features, reading captions,
captioning a folder), on stderr: a tqdm bar where stderr is a terminal; elsewhere (a job log, nohup,
a cluster scheduler) a plain line at a steady interval, as training frameworks write their logs:
the stage, done/total, the rate, the time left and, while training, the step's loss; work done
within one interval writes nothing there. --quiet turns both off.

--quiet sets CAPTIONING_QUIET=1 in the environment, so that the processes torchrun or a DataLoader
starts inherit it. CAPTIONING_LOG_SECONDS sets the interval between plain lines (default 30). A
terminal that reports a width of 0 (a pseudo-terminal nobody sized) gets the plain lines.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

QUIET = "CAPTIONING_QUIET"
LOG_SECONDS = "CAPTIONING_LOG_SECONDS"
LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def quiet() -> None:
    """No progress from here on, in this process and the ones it starts."""
    os.environ[QUIET] = "1"


class LogLines(tqdm):
    """tqdm's counting and timing, shown as whole lines (no carriage return, no bar) at most every
    `mininterval` seconds, and once more when the work ends: what a log file can hold."""

    def display(self, msg: str | None = None, pos: int | None = None) -> None:
        if self.n == getattr(self, "_last_line_n", None):  # close() after a line that said as much
            return
        self._last_line_n = self.n
        self.fp.write(self.format_meter(**{**self.format_dict, "ncols": None}) + "\n")
        self.fp.flush()

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        super().set_postfix(ordered_dict, refresh=False, **kwargs)  # shown with the next line, not a line of its own


class _WholeLines:
    """A stream that passes on whole lines only: tqdm's own bare newline and carriage return (which
    place a terminal's cursor) are dropped."""

    def __init__(self, out: Any):
        self.out = out

    def write(self, text: str) -> None:
        if text.strip():
            self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def bar(iterable: Iterable | None = None, *, show: bool | None = None, **options: Any) -> tqdm:
    """Progress on stderr (or `file`). `show`: None draws a bar where the output is a terminal and
    writes plain lines elsewhere; True draws a bar whatever the output; False shows nothing; --quiet
    wins over all three."""
    if os.environ.get(QUIET) == "1" or show is False:
        return tqdm(iterable, disable=True, **options)
    out = options.get("file") or sys.stderr
    # a terminal that reports no width (a pseudo-terminal nobody sized) would get a bar of no width: nothing
    terminal = hasattr(out, "isatty") and out.isatty() and _columns(out) != 0
    if show or terminal:
        return tqdm(iterable, disable=False, dynamic_ncols=True, **options)
    seconds = log_seconds()
    # delay: work shorter than one interval writes nothing; longer work, a line each interval and one at its end
    options = {**options, "file": _WholeLines(out), "mininterval": seconds, "maxinterval": seconds, "miniters": 1,
               "delay": seconds, "bar_format": LINE_FORMAT, "leave": True}
    return LogLines(iterable, disable=False, **options)


DEFAULT_SECONDS = 30.0
_said: set[str] = set()  # settings already warned about in this process


def log_seconds() -> float:
    """CAPTIONING_LOG_SECONDS, or 30 where it is not a number of seconds (said once, in one line:
    a progress setting never stops a run)."""
    text = os.environ.get(LOG_SECONDS, "")
    try:
        seconds = float(text) if text.strip() else DEFAULT_SECONDS
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds) and seconds >= 0:
        return seconds
    if text not in _said:
        _said.add(text)
        print(f"warning: {LOG_SECONDS}={text!r} is not a number of seconds (0 or more): a progress line every "
              f"{DEFAULT_SECONDS:g} s", file=sys.stderr)
    return DEFAULT_SECONDS


def _columns(out: Any) -> int | None:
    """The width of the terminal `out` writes to, None where it cannot be asked."""
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None
