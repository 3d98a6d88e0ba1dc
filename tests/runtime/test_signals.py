"""The stop signals are the command's own: answered once, in its process, not in the processes it forks."""

from __future__ import annotations

import os
import signal

from captioning.runtime.signals import StopSignalHandler


class Recorded(StopSignalHandler):
    def __init__(self) -> None:
        super().__init__()
        self.received: list[int] = []

    def handle(self, signum: int) -> None:
        self.received.append(signum)


def test_the_command_answers_a_stop_signal_and_a_process_it_forked_does_not() -> None:
    """Ctrl-C reaches the terminal's whole process group: with train.num_workers=2 each DataLoader
    worker, forked with the handler, printed "SIGINT: saving a checkpoint ..." beside the command."""
    with Recorded() as handler:
        child = os.fork()
        if child == 0:  # the worker: the signal must not reach `handle` here
            os.kill(os.getpid(), signal.SIGINT)
            os._exit(3 if handler.received else 0)
        _, status = os.waitpid(child, 0)
        os.kill(os.getpid(), signal.SIGTERM)
    assert os.waitstatus_to_exitcode(status) == 0
    assert handler.received == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
