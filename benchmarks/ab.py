"""Relative speed of two implementations, interleaved in one process (A, B, A, B, ...), medians;
or of two whole commands, start-up included, taking turns the same way.

    python benchmarks/ab.py --case a --impls reference,fast [--rounds 7] [--threads 2]
    python benchmarks/ab.py --commands "COMMAND A" "COMMAND B" [--rounds 7]

On a shared or noisy machine absolute numbers drift with the load; alternating the two on the same
model and the same batches keeps the ratio meaningful. Cases and implementations as in run.py
(c3/c5 here use one fixed batch of images, --images).

With --commands, each command is one string split as a shell splits words (no shell runs it: `env
X=1 cmd` sets a variable), its output thrown away, one run of each first not counted. Each run's wall
seconds, CPU seconds (user + system) and peak memory (the command's own process's resident
high-water mark, as the kernel reports it at its end): min, median and max of each, and of A / B
taken pair by pair.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import time
from pathlib import Path

import torch
from run import BEAM_STEPS, Implementation, machine, make_decoder, make_tokens

from captioning.data.vocab import Vocabulary
from captioning.model.paper import cross_entropy, doubly_stochastic

SHAPES = {"a": (32, 196, 2048), "b": (64, 49, 512)}


def training_steps(case: str, impls: list[Implementation]):
    batch, cells, channels = SHAPES[case]
    decoder = make_decoder(annotation_dim=channels, device="cpu").train()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4, fused=True)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(batch, cells, channels, generator=generator), make_tokens(batch, generator))
               for _ in range(4)]

    def make(impl: Implementation):
        counter = iter(range(10**9))

        def step() -> None:
            annotations, tokens = batches[next(counter) % len(batches)]
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            mask = (targets != Vocabulary.pad_id).float()
            output = impl.forward(decoder, annotations, inputs, mask.sum(1).long())
            loss = cross_entropy(output.logits, targets, mask) + doubly_stochastic(output.alphas, mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return step

    return [make(impl) for impl in impls], batch


def beam_steps(case: str, impls: list[Implementation], images: int):
    decoder = make_decoder(annotation_dim=2048, device="cpu").eval()
    annotations = torch.randn(images, 196, 2048, generator=torch.Generator().manual_seed(2))

    def make(impl: Implementation):
        def step() -> None:
            impl.beam_search(decoder, annotations, beam_size=int(case[1]), max_length=BEAM_STEPS,
                             min_length=BEAM_STEPS)
        return step

    return [make(impl) for impl in impls], images


MEASURES = ("wall_s", "cpu_s", "peak_mib")


def run_command(command: list[str]) -> dict[str, float]:
    """One run of a whole command: its wall seconds, CPU seconds and peak MiB. One that fails stops here."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"error: `{shlex.join(command)}` exited with {process.returncode}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024}


def spreads(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """min, median and max of each measure over A's runs and B's, and of A / B pair by pair."""
    def spread(values: list[float]) -> dict[str, float]:
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    table = {f"{name} {measure}": spread([run[measure] for run in runs])
             for name, runs in (("A", a), ("B", b)) for measure in MEASURES}
    table.update({f"A/B {measure}": spread([x[measure] / y[measure] for x, y in zip(a, b)]) for measure in MEASURES})
    return table


def commands_in_turns(commands: list[str], rounds: int) -> None:
    a, b = (shlex.split(command) for command in commands)
    run_command(a)  # a warm-up of each: the files the commands read come into the page cache
    run_command(b)
    runs_a, runs_b = [], []
    for _ in range(rounds):
        runs_a.append(run_command(a))
        runs_b.append(run_command(b))
    info = machine()
    print(f"# {info['date']}  {info['cpu']} (load {info['load_average']})  {rounds} runs of each, in turns")
    print(f"A: {shlex.join(a)}\nB: {shlex.join(b)}")
    print(f"{'':16}{'min':>10}{'median':>10}{'max':>10}")
    for name, values in spreads(runs_a, runs_b).items():
        print(f"{name:16}" + "".join(f"{values[key]:10.3f}" for key in ("min", "median", "max")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="a", choices=("a", "b", "c3", "c5"))
    parser.add_argument("--impls", default="reference,fast")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--images", type=int, default=8, help="images at once for c3/c5")
    parser.add_argument("--commands", nargs=2, metavar="COMMAND", help="two whole commands in turns, instead")
    args = parser.parse_args()
    if args.commands:
        commands_in_turns(args.commands, args.rounds)
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    names = args.impls.split(",")
    impls = [Implementation(name) for name in names]
    if args.case in SHAPES:
        steps, items = training_steps(args.case, impls)
    else:
        steps, items = beam_steps(args.case, impls, args.images)
    info = machine()
    print(f"# {info['date']}  {info['cpu']} (load {info['load_average']})  torch {info['torch']}  threads "
          f"{info['threads']}  commit {info['commit']}  case {args.case}  {Path(__file__).name}")
    for step in steps:  # warm-up
        step()
    seconds: list[list[float]] = [[] for _ in steps]
    for _ in range(args.rounds):
        for i, step in enumerate(steps):
            start = time.perf_counter()
            step()
            seconds[i].append(time.perf_counter() - start)
    base = statistics.median(seconds[0])
    for name, s in zip(names, seconds):
        median = statistics.median(s)
        print(f"{name:<10} {items / median:8.2f} per s  median {median:.3f} s of {len(s)}  "
              f"(min {min(s):.3f}, max {max(s):.3f})  speed-up vs {names[0]}: {base / median:.2f}x")


if __name__ == "__main__":
    main()
