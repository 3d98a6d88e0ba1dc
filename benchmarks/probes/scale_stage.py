"""What benchmarks/scale.py runs inside each stage's process: a stand-in for the encoder's forward,
the clocks around a training run's steps, and a sampler of the process's memory and its workers'.

    python benchmarks/probes/scale_stage.py STAGE START -- ARGS...
    # STAGE: features, first-steps, train, resume, eval, caption

ARGS are those of `captioning` (python -m captioning.cli). START is the parent's clock (time.time())
when it started this process, so that "start-up" counts the interpreter and the imports too. The
last line printed is a JSON object of what was measured.

The stand-in: every stage that would run the encoder's convolutions (prepare-features, caption)
gets an encoder of the config's name and output shape (VGG-19 at 224²: 14 x 14 x 512) whose
forward is an average pool and a repeat, so the numbers are the pipeline's (reading and resizing
the JPEGs, writing and checking the cache, decoding, scoring), and the encoder's own cost per image
is measured apart (`scale.py encoders`). The cache it writes is named after the real encoder, so
training finds it as it would find the real one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn


class VggShaped(nn.Module):
    """[B, 3, 224, 224] -> [B, 512, 14, 14]: VGG-19's stride-16 output shape at the cost of a pool."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.avg_pool2d(images, 16)  # [B, 3, 14, 14]
        return pooled.repeat(1, 171, 1, 1)[:, :512]  # [B, 512, 14, 14]


def stand_in_encoder(_config=None):
    from captioning.model.encoder import IMAGENET_MEAN, IMAGENET_STD, Encoder

    body = nn.Sequential(OrderedDict(pool=VggShaped()))
    return Encoder(body=body, dim=512, mean=IMAGENET_MEAN, std=IMAGENET_STD).fine_tune(None).eval()


def _status_kb(pid: int | str, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _private_kb(pid: int) -> tuple[int, int]:
    """(anonymous, shared-memory) kB that only this process maps: what a forked worker holds of its
    own (its heap, and the batches it has made and the main process has not taken yet). Pages of
    mapped files (the feature cache it reads, the libraries) are left out: they are the page
    cache's, dropped under pressure."""
    anonymous = shared = 0
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=6)
        if "-" in head[0] and ":" not in head[0]:  # a mapping's first line: address range, ..., name
            name = head[5] if len(head) > 5 else ""
        elif head[0] in ("Private_Clean:", "Private_Dirty:"):
            if name.startswith("/dev/shm") or "torch_" in name:
                shared += int(head[1])
            elif not name.startswith("/"):
                anonymous += int(head[1])
    return anonymous, shared


def _children() -> list[int]:
    pids = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that has just ended
            pids += [int(pid) for pid in (task / "children").read_text().split()]
    return pids


class Memory:
    """Samples, every 50 ms, the process's anonymous resident memory (its own, beyond the pages of
    the memory-mapped cache) and, every 0.5 s, each child's own memory (_private_kb); keeps the
    peak of each phase."""

    def __init__(self) -> None:
        self.phase = "start-up"
        self.anon: dict[str, int] = {}  # phase -> peak kB
        self.worker = self.worker_batches = 0  # peak kB of any one child: its heap, its batches in flight
        self.ticks = 0
        threading.Thread(target=self._run, daemon=True).start()

    def enter(self, phase: str) -> None:
        self.sample()
        self.phase = phase
        self.sample()

    def sample(self) -> None:
        anon = _status_kb("self", "RssAnon")
        self.anon[self.phase] = max(self.anon.get(self.phase, 0), anon)

    def sample_children(self) -> None:
        for pid in _children():
            try:
                anonymous, shared = _private_kb(pid)
            except (OSError, IndexError):
                continue
            self.worker, self.worker_batches = max(self.worker, anonymous), max(self.worker_batches, shared)

    def _run(self) -> None:
        while True:
            self.sample()
            self.ticks += 1
            if self.ticks % 10 == 0:
                self.sample_children()
            time.sleep(0.05)

    def report(self) -> dict:
        return {"anon_gb": {phase: kb / 1e6 for phase, kb in self.anon.items()}, "worker_gb": self.worker / 1e6,
                "worker_batches_gb": self.worker_batches / 1e6, "peak_rss_gb": _status_kb("self", "VmHWM") / 1e6}


def _wrap(owner, name: str, before=None, after=None) -> None:
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if before is not None:
            before()
        result = original(*args, **kwargs)
        if after is not None:
            after()
        return result

    setattr(owner, name, wrapped)


def instrument_training(memory: Memory, events: dict, *, stop_after: int | None) -> None:
    """Clocks around the run's build, its epoch's batches, each step, each validation and save.
    `stop_after`: leave (os._exit) after this many steps of this process, printing what was measured."""
    from captioning.train import loop, paper_objective

    events.update(steps=[], validations=[], saves=[])
    _wrap(loop.Run, "start", after=lambda: events.setdefault("built", time.time()))

    original_batches = paper_objective.PaperObjective.batches

    def batches(self, epoch):
        start = time.time()
        result = original_batches(self, epoch)
        events.setdefault("shuffles", []).append((start, time.time()))
        return result

    paper_objective.PaperObjective.batches = batches
    original_step = loop.Run.step

    def step(self, batch, *, size):
        start = time.time()
        if not events["steps"]:
            events["first_batch"] = start
            memory.enter("steps")
        result = original_step(self, batch, size=size)
        events["steps"].append((start, time.time()))
        if stop_after is not None and len(events["steps"]) >= stop_after:
            finish(memory, events)
            os._exit(0)
        return result

    loop.Run.step = step
    original_validate = loop.Run.validate

    def validate(self):
        memory.enter("validation")
        start = time.time()
        result = original_validate(self)
        events["validations"].append(time.time() - start)
        memory.enter("after validation")
        return result

    loop.Run.validate = validate
    original_save = loop.Run.save

    def save(self, *, best=False):
        start = time.time()
        original_save(self, best=best)
        events["saves"].append(time.time() - start)

    loop.Run.save = save


def finish(memory: Memory, events: dict) -> None:
    memory.sample()
    print(json.dumps({**events, **memory.report(), "end": time.time()}), flush=True)


STAGES = ("features", "first-steps", "train", "resume", "eval", "caption")


def main() -> int:
    own, argv = sys.argv[1:], []
    if "--" in own:  # what follows is captioning's, not ours
        own, argv = own[:own.index("--")], own[own.index("--") + 1:]
    parser = argparse.ArgumentParser(usage="python benchmarks/probes/scale_stage.py STAGE START -- ARGS...",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("start", type=float, help="the parent's time.time() when it started this process")
    args = parser.parse_args(own)
    stage, started = args.stage, args.start
    memory = Memory()
    events: dict = {"started": started, "imported": None}
    from captioning import cli
    from captioning.model import encoder

    events["imported"] = time.time()
    encoder.Encoder.from_config = classmethod(lambda cls, config: stand_in_encoder(config))
    if stage in ("train", "first-steps", "resume"):  # the last two leave after 3 steps
        instrument_training(memory, events, stop_after=None if stage == "train" else 3)
    else:
        memory.enter(stage)
    code = cli.main(argv)
    finish(memory, events)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
