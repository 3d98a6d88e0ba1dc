"""Progress bars: on a terminal, off in logs, off everywhere with --quiet (and in the processes started after)."""

from __future__ import annotations

import io
import os

from captioning.progress import QUIET, bar, quiet


def test_bars_follow_the_terminal_unless_told(monkeypatch) -> None:
    monkeypatch.delenv(QUIET, raising=False)
    assert bar(range(3), file=io.StringIO()).disable  # not a terminal: off
    shown = io.StringIO()
    for _ in bar(range(3), show=True, file=shown):
        pass
    assert "3/3" in shown.getvalue()
    assert bar(range(3), show=False, file=io.StringIO()).disable


def test_quiet_wins_and_is_inherited(monkeypatch) -> None:
    monkeypatch.setenv(QUIET, "0")  # restored after the test
    quiet()
    assert os.environ[QUIET] == "1"  # what torchrun's and DataLoader's processes read
    silent = io.StringIO()
    for _ in bar(range(3), show=True, file=silent):
        pass
    assert silent.getvalue() == ""
