"""Run train.py as N processes of one group, as torchrun would (gloo on the CPU), and see each
process's own exit code and output; optionally with one fault planted in one process.

Run as a module (`python -m tests.train.ranks ARGS`), it plants the faults that CAPTIONING_TEST_FAULT
names, "KIND:RANK:STEP" (RANK "all": every process; several separated by commas), in this process
before training:
    sigterm  the process sends itself SIGTERM before that step
    inf, nan that step's cross-entropy is +inf (NaN) in that process; its gradient stays finite, so
             only the processes' agreement can make the others skip the step too
    nanbatch that step's annotations are NaN in that process: its logits, rewards and gradients are
             NaN, and DDP's average carries the NaN gradients to every process
    empty    that step's batch of that process has no readable image
    slow     that process sleeps CAPTIONING_TEST_SLEEP seconds before validating at that step
CAPTIONING_TEST_FP16=1 makes train.amp take a GPU's fp16 path with a GradScaler (on the CPU), where
bf16 would be taken otherwise. At the end each process writes its decoder's weights, REINFORCE
baseline and scaler state to OUT_DIR/rank{RANK}.pt, so a test can check that the processes still
hold one model.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.tiny import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(processes: int, args: list[str], *, cwd: Path, fault: str = "", timeout: float = 300,
           sleep: float = 0.0, fp16: bool = False) -> list[subprocess.CompletedProcess]:
    """Start `processes` ranks of `train.py args` and wait for all; one CompletedProcess per rank.
    `fp16`: train.amp takes the fp16 path with a GradScaler (CAPTIONING_TEST_FP16)."""
    port = free_port()
    running = []
    for rank in range(processes):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "CAPTIONING_TEST_FAULT": fault,
               "CAPTIONING_TEST_SLEEP": str(sleep), "CAPTIONING_QUIET": "1",
               "CAPTIONING_TEST_FP16": "1" if fp16 else ""}
        command = [sys.executable, "-m", "tests.train.ranks", "--device", "cpu", *args]
        running.append(subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True))
    deadline = time.monotonic() + timeout
    done = []
    for rank, process in enumerate(running):
        try:
            out, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # a hang: stop every process and say so
            for other in running:
                other.kill()
            raise AssertionError(f"rank {rank} still running after {timeout:.0f} s: the processes hang") from None
        done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return done


def _plant(faults: list[tuple[str, int | None, int]]) -> None:
    """Each fault (kind, rank or None for every process, step) in this process."""
    import torch

    from captioning.runtime import hardware
    from captioning.runtime.precision import Precision
    from captioning.train import loop, validation
    from captioning.train import paper_objective as objective_module

    rank = int(os.environ["RANK"])
    current = {"step": 0}
    if os.environ.get("CAPTIONING_TEST_FP16"):
        hardware.precision_for = lambda device, amp: (Precision(device.type, torch.float16, "fp16 with a scaler "
                                                                "(CAPTIONING_TEST_FP16)") if amp else Precision())

    def now(kind: str) -> bool:
        return any(k == kind and where in (None, rank) and current["step"] == step for k, where, step in faults)

    run_step = loop.Run.step

    def step_with_fault(self, batch, *, size):
        current["step"] = self.progress.step + 1
        if now("sigterm"):
            os.kill(os.getpid(), signal.SIGTERM)
        if now("empty"):
            batch = type(batch)(annotations=batch.annotations[:0], tokens=batch.tokens[:0], lengths=batch.lengths[:0],
                                images=None if batch.images is None else batch.images[:0])
        if now("nanbatch"):
            batch = type(batch)(annotations=batch.annotations * float("nan"), tokens=batch.tokens,
                                lengths=batch.lengths)
        return run_step(self, batch, size=size)

    loop.Run.step = step_with_fault

    cross_entropy = objective_module.cross_entropy

    def cross_entropy_with_fault(*args, **kwargs):
        xe = cross_entropy(*args, **kwargs)
        for kind in ("inf", "nan"):
            if now(kind):
                return xe + float(kind)  # the loss is not finite, its gradient is xe's: finite
        return xe

    objective_module.cross_entropy = cross_entropy_with_fault

    validate = validation.validation_metrics

    def slow_validate(*args, **kwargs):
        if now("slow"):
            time.sleep(float(os.environ["CAPTIONING_TEST_SLEEP"]))
        return validate(*args, **kwargs)

    loop.validation_metrics = slow_validate

    close = loop.Run.close

    def close_and_keep(self):
        state = {"decoder": self.model.decoder.state_dict(), "step": self.progress.step,
                 "skipped_steps": self.progress.skipped_steps,
                 "baseline": self.objective.state_dict().get("baseline"),
                 "scaler": self.scaler.state_dict()}
        torch.save(state, self.out / f"rank{rank}.pt")
        close(self)

    loop.Run.close = close_and_keep


if __name__ == "__main__":
    planted = []
    for fault in filter(None, os.environ.get("CAPTIONING_TEST_FAULT", "").split(",")):
        kind, where, at = fault.split(":")
        planted.append((kind, None if where == "all" else int(where), int(at)))
    _plant(planted)
    from captioning.cli import train_main

    raise SystemExit(train_main(sys.argv[1:]))
