"""The stop signals, SIGTERM and SIGINT, answered by a command of its own while it runs.

A cluster's preemption or `kill` sends SIGTERM, Ctrl-C sends SIGINT. A shell also starts a
background job with SIGINT ignored, which Python then leaves ignored, so that `kill -INT` would not
reach it. Training and the caption command therefore answer both, each in its own way: training
saves a checkpoint after the step (train/loop.py), the caption command finishes its page
(cli/caption.py). What they share is here: the handlers set while a `with` block runs, and put
back as they were after it.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # in the order the processes agree on them (runtime/distributed.py)


class StopSignalHandler:
    """Inside `with`, SIGTERM and SIGINT call `handle(signum)`; after it, the handlers set before
    are back. Python runs signal handlers in the main thread only, so another thread sets none."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._owner: int | None = None

    def handle(self, signum: int) -> None:
        raise NotImplementedError

    def _received(self, signum: int, frame: object) -> None:
        # A process forked inside the block (a DataLoader's worker) inherits the handler, and Ctrl-C
        # reaches the terminal's whole process group: the command answers once, in its own process,
        # and stops its workers itself.
        if os.getpid() == self._owner:
            self.handle(signum)

    def __enter__(self):
        self._owner = os.getpid()
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._received)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
