"""Progress: a bar on a terminal, plain lines at an interval in a log, nothing with --quiet (and in the
processes started after)."""

from __future__ import annotations

import io
import os
import time

from captioning.progress import LOG_SECONDS, QUIET, bar, quiet


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_and_show_false_nothing(monkeypatch) -> None:
    monkeypatch.delenv(QUIET, raising=False)
    drawn = Terminal()
    for _ in bar(range(3), file=drawn):
        pass
    assert "3/3" in drawn.getvalue() and "\r" in drawn.getvalue()  # a bar redrawn in place
    shown = io.StringIO()
    for _ in bar(range(3), show=True, file=shown):
        pass
    assert "3/3" in shown.getvalue()
    silent = io.StringIO()
    for _ in bar(range(3), show=False, file=silent):
        pass
    assert silent.getvalue() == ""


def test_a_log_gets_whole_lines_at_an_interval_with_the_loss(monkeypatch) -> None:
    """Where the output is not a terminal (a job log, nohup): a line every CAPTIONING_LOG_SECONDS with
    done/total, rate and time left (and the loss set on it), one at the end; no carriage return, no
    bar, and not a line per step."""
    monkeypatch.delenv(QUIET, raising=False)
    monkeypatch.setenv(LOG_SECONDS, "0.1")
    log = io.StringIO()
    steps = bar(range(40), file=log, desc="epoch 2", unit="batch", leave=False)
    for step in steps:
        time.sleep(0.01)
        steps.set_postfix(loss=f"{1 / (step + 1):.3f}")
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n")
    assert not lines[0].startswith("epoch 2: 0/40 [")  # the first line once an interval has passed
    assert lines[-1].startswith("epoch 2: 40/40 [") and "batch/s, loss=0.025]" in lines[-1]
    assert 3 <= len(lines) <= 12, lines  # about every 0.1 s of 0.4 s, not one per step
    assert all(line.startswith("epoch 2: ") and "<" in line for line in lines)  # elapsed<left on each


def test_work_shorter_than_the_interval_writes_nothing_to_a_log(monkeypatch) -> None:
    monkeypatch.delenv(QUIET, raising=False)
    monkeypatch.setenv(LOG_SECONDS, "3600")
    log = io.StringIO()
    counted = bar(total=500, file=log, unit="image")
    for _ in range(500):
        counted.update(1)
    counted.close()
    assert log.getvalue() == ""


def test_quiet_wins_and_is_inherited(monkeypatch) -> None:
    monkeypatch.setenv(QUIET, "0")  # restored after the test
    quiet()
    assert os.environ[QUIET] == "1"  # what torchrun's and DataLoader's processes read
    silent = io.StringIO()
    for _ in bar(range(3), show=True, file=silent):
        pass
    assert silent.getvalue() == ""


def test_a_log_interval_that_is_not_a_number_is_one_line_and_the_default(monkeypatch, capsys) -> None:
    from captioning.progress import log_seconds

    for text in ("abc", "-1", "nan"):
        monkeypatch.setenv(LOG_SECONDS, text)
        assert log_seconds() == 30.0
        assert log_seconds() == 30.0  # said once
        assert capsys.readouterr().err == (f"warning: CAPTIONING_LOG_SECONDS={text!r} is not a number of seconds "
                                           "(0 or more): a progress line every 30 s\n")
    monkeypatch.setenv(LOG_SECONDS, "0.5")
    assert log_seconds() == 0.5


def test_a_terminal_of_no_width_gets_plain_lines(monkeypatch) -> None:
    """A pseudo-terminal nobody sized reports 0 columns: a bar there showed nothing at all."""
    monkeypatch.delenv(QUIET, raising=False)
    monkeypatch.setenv(LOG_SECONDS, "0.01")
    reader, writer = os.openpty()
    assert os.get_terminal_size(writer).columns == 0
    with os.fdopen(writer, "w") as out:
        for _ in bar(range(3), desc="work", file=out):
            time.sleep(0.05)
    shown = ""
    while True:  # what the terminal got, to its end (the kernel hands it over a little later)
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # EIO: the writer closed and all was read
            break
        if not chunk:
            break
        shown += chunk.decode()
    os.close(reader)
    assert "work: 3/3" in shown and "\r" not in shown.replace("\r\n", "")  # the pty ends lines in \r\n
