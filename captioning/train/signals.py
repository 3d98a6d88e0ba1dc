"""Stopping cleanly on SIGTERM / SIGINT: the training loop saves a checkpoint and returns."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from tqdm import tqdm


class StopSignals:
    """SIGTERM / SIGINT (a cluster's preemption, Ctrl-C) ask the loop to save and stop after the
    current step; a second Ctrl-C interrupts at once."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum
        tqdm.write(f"{signal.Signals(signum).name}: saving a checkpoint after this step, then stopping",
                   file=sys.stderr)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
