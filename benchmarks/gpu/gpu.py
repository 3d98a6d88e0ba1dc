"""The first GPU run, in one command: the package's CUDA paths proved and measured on a bare machine
in at most --minutes (9.5), set-up included.

    python benchmarks/gpu/gpu.py --out DIR [--minutes 9.5] [--wheels gpu-wheels] [--parts paths,train,...] [--smoke]
        [--port third_party/sgrvinod]
    python benchmarks/gpu/gpu.py --fetch-wheels [--wheels gpu-wheels]   # first, where the package index is reachable

Set-up: the wheels of `make gpu-wheels` that this Python lacks are installed without a network into
a folder of their own, the project itself with --no-deps (install.py). Then the parts,
each in its own process, within its own time limit, in this order:

  paths     the device, train.amp's precision, bf16 autocast, fp16 with the scaler and an overflow
            skipped, half batches pinned, the dry run, a checkpoint written on the GPU, resumed on
            the CPU and back, captioned from on both (checks.py)
  train     training steps, captions/s and peak GPU memory: soft (fused and step-by-step) and hard
            attention, 14x14x512 and 7x7x2048 annotations, a 10 000-word vocabulary, batches 64 to
            512, fp32 (TF32), bf16 autocast, fp16 with the scaler (speed.py)
  beam      beam 3 at 32 and 256 images at once, images/s
  encoders  VGG-19, ResNet-101 (224² and 448²), EfficientNet-Lite2: images/s, fp32 and bf16
  torchrun  train.py under torchrun on NCCL, 1 process (and N on N GPUs): steps, a SIGTERM, the
            checkpoint, a resume (runs.py)
  training  the embedded default on shapes data made here: the feature cache, a few epochs on the
            GPU, one on the CPU; time per epoch and validation numbers
  compile   torch.compile of the training step and of beam search's step beside eager, with its
            graph breaks; where it does not work, why
  profile   where the training step's time goes: kernels by time, launches and allocated bytes at
            B = 64, 256 and 512, in bf16 (profiling.py; DIR/profile.md)
  port      the most used port's DecoderWithAttention as its own code (--port DIR: `make gpu-port`)
            beside ours at the same sizes, with our ratio to it (port.py)
  graph     the training step as one CUDA graph (train.graph) beside the eager step, batches 64 to
            512 in bf16: captions/s, its ratio to eager, the capture's seconds, the loss's gap (graphs.py)

Time a part leaves unused goes to the next, and the last part named takes what is left of --minutes.
Every case is a row of DIR/gpu.json and DIR/gpu.md, both written again after each row: measured,
failed with its cause, or not run and why (a part stopped at its limit, a budget spent); a run cut
short still leaves what it measured. The parts' output goes to DIR/gpu.log. Without CUDA (or with
--smoke) the same parts run at tiny sizes in seconds: the smoke, which the test suite runs
(tests/test_gpu_benchmark.py). The sizes and each part's seconds: plan.py; the rows: report.py.

--fetch-wheels (`make gpu-wheels`) is the step before, on a machine with the package index: the
wheels the set-up installs, into --wheels (wheels.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import FAILED, NOT_RUN, Cases, Report, Row, read_rows
from wheels import LIMIT_MIB

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve()  # what each part's process runs (`--part NAME`)
PARTS = ("paths", "train", "beam", "encoders", "torchrun", "training", "compile", "profile", "port", "graph")
MINIMUM_SECONDS = 10  # a part given less is not started: "not run", the budget spent
GRACE_SECONDS = 10  # between a part's own deadline and its process being stopped
STOP_RESERVE = 15  # the command's last seconds: for stopping a part that overran and writing the report


# ----------------------------------------------------------------------------------------------- a part's process

def run_part(args: argparse.Namespace) -> int:
    """In the part's own process: run it, its rows appended to args.rows as they come."""
    import torch
    from checks import paths
    from graphs import graph
    from plan import GPU, SMOKE, Context, free_memory
    from port import port
    from profiling import profile
    from runs import short_training, torchrun
    from speed import beam, compiled, encoders, training_speed

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plan = SMOKE if args.smoke or device.type != "cuda" else GPU
    deadline = time.monotonic() + args.seconds
    cases = Cases(args.part, args.rows, deadline=deadline, cleanup=lambda: free_memory(device))
    context = Context(plan=plan, device=device, work=args.work, cases=cases, out=args.out)
    parts = {"paths": paths, "train": training_speed, "beam": beam, "encoders": encoders, "torchrun": torchrun,
             "training": short_training, "compile": compiled, "profile": profile, "port": port,
             "graph": graph}
    parts[args.part](context)
    return 0


# ----------------------------------------------------------------------------------------------- the command

def machine(args: argparse.Namespace) -> dict[str, str]:
    """What the run was on, read without touching the GPU (the parts' processes do that)."""
    info = {"command": "python benchmarks/gpu/gpu.py " + shlex.join(args.argv), "date":
            datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "python": platform.python_version(), "cpus": str(os.cpu_count())}
    for key, command in (("gpu", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"]),
                         ("commit", ["git", "-C", str(REPO), "describe", "--always", "--dirty"])):
        try:
            answer = subprocess.run(command, capture_output=True, text=True, timeout=20)
            info[key] = "; ".join(answer.stdout.split("\n")[:8]).strip("; ") or "unknown"
        except (OSError, subprocess.SubprocessError):
            info[key] = "none" if key == "gpu" else "unknown"
    return info


def last_output(log: Path, since: int) -> str:
    """The last line the part's process printed that says something (its error, usually)."""
    with log.open("rb") as file:
        file.seek(since)
        lines = [line.strip() for line in file.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def run_in_process(part: str, *, args: argparse.Namespace, seconds: float, report: Report, env: dict[str, str],
                   work: Path) -> None:
    """Start the part's process, add its rows to the report as they come, stop it at its limit; the
    cases it planned and never reported get a row that says why."""
    rows = work / f"rows_{part}.jsonl"
    log = args.out / "gpu.log"
    with log.open("a") as file:
        file.write(f"\n==== {part} (limit {seconds:.0f} s) ====\n")
        since = file.tell()
    command = [sys.executable, str(SCRIPT), "--part", part, "--rows", str(rows), "--work", str(work),
               "--out", str(args.out),
               "--seconds", f"{max(seconds - GRACE_SECONDS, 1):.0f}", *(["--smoke"] if args.smoke else [])]
    planned: list[str] = []
    reported: set[str] = set()
    seen, stopped = 0, False
    with log.open("a") as output:
        running = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=work,
                                   start_new_session=True)  # its children (torchrun's) are stopped with it
        kill_at = time.monotonic() + seconds

        def collect() -> None:
            nonlocal seen
            entries, seen = read_rows(rows, seen)
            for entry in entries:
                if "plan" in entry:
                    planned.extend(entry["plan"])
                else:
                    row = Row(**entry["row"])
                    reported.add(row.case)
                    report.add(row)

        while running.poll() is None:
            collect()
            if time.monotonic() > kill_at:
                stopped = True
                _stop(running)
                break
            time.sleep(0.2)
        collect()
    code = running.returncode
    if code is None:  # even SIGKILL did not end it in time (a process stuck in the kernel, on a hung GPU)
        ended = "did not end when killed"
    else:
        ended = f"killed by {signal.Signals(-code).name}" if code < 0 else f"ended with exit code {code}"
    if stopped:  # the first case it had not reported was running then
        running_why = f"the part was stopped at its time limit ({seconds:.0f} s) while this case ran"
        later_why = f"the part was stopped at its time limit ({seconds:.0f} s) before this case"
    elif code != 0:
        running_why = f"the part's process {ended}: {last_output(log, since)}"
        later_why = f"the part's process {ended} before this case"
    else:
        running_why = later_why = "the part ended without running it"
    missing = [case for case in planned if case not in reported]
    for index, case in enumerate(missing):
        failed = index == 0 and code != 0 and not stopped  # the case its process died in
        report.add(Row(part, case, FAILED if failed else NOT_RUN, running_why if index == 0 else later_why))
    if not planned and (stopped or code != 0):
        report.add(Row(part, "(the whole part)", FAILED, running_why))


def _stop(running: subprocess.Popen) -> None:
    """SIGTERM to the part's process group, SIGKILL after a few seconds."""
    for signum, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(running.pid, signum)
        except ProcessLookupError:
            return
        try:
            running.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="where gpu.json, gpu.md and gpu.log are written")
    parser.add_argument("--minutes", type=float, default=9.5, help="the whole command's time, set-up included")
    parser.add_argument("--wheels", type=Path, default=REPO / "gpu-wheels",
                        help="the wheels folder: what --fetch-wheels writes and the set-up installs (default: "
                        "gpu-wheels/)")
    parser.add_argument("--fetch-wheels", action="store_true", help="only download the wheels into --wheels, where "
                        "the package index is reachable (`make gpu-wheels`), and stop")
    parser.add_argument("--python-version", default="3.12", help="with --fetch-wheels: the GPU machine's Python")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB,
                        help="with --fetch-wheels: what the tree and the wheels together may weigh (MiB)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma-separated, from " + ",".join(PARTS) + "; empty: the set-up alone")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes even where there is a GPU")
    parser.add_argument("--port", type=Path, default=REPO / "third_party" / "sgrvinod",
                        help="the port part's code: a clone of sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning "
                        "(its models.py; `make gpu-port`, git-ignored; default: third_party/sgrvinod)")
    parser.add_argument("--keep-work", action="store_true", help="keep the folder of the parts' data, weights "
                        "and runs (a temporary folder, removed at the end otherwise)")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # internal: run one part here
    parser.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.part:
        return run_part(args)
    if args.fetch_wheels:
        from wheels import fetch

        return fetch(dest=args.wheels, python_version=args.python_version, limit_mib=args.limit_mib)
    if args.out is None:
        parser.error("--out DIR is required (or --fetch-wheels, to download the wheels first)")
    parts = [part for part in args.parts.split(",") if part]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)} (known: {', '.join(PARTS)})")
    return run(args, parts)


def run(args: argparse.Namespace, parts: list[str]) -> int:
    from install import set_up

    deadline = time.monotonic() + 60 * args.minutes - STOP_RESERVE
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.log").write_text("")
    work = Path(tempfile.mkdtemp(prefix="captioning-gpu-"))
    report = Report(args.out, machine(args))
    print(f"writing {args.out / 'gpu.md'} and gpu.json after every row", flush=True)
    start = time.monotonic()
    setup_rows, env = set_up(wheels=args.wheels.resolve(), site=work / "site")
    report.parts_s["setup"] = time.monotonic() - start
    for row in setup_rows:
        report.add(row)
    print(f"setup: {report.parts_s['setup']:.0f} s", flush=True)
    env["PYTHONUNBUFFERED"] = "1"
    env["CAPTIONING_PORT_DIR"] = str(args.port.resolve())  # port.PORT_VARIABLE: where the port part finds it
    try:
        import torch  # the machine's own: no wheel brings it
    except ImportError as error:
        if parts:
            report.add(Row("setup", "import torch", FAILED, f"{error}: the parts need the machine's own torch"))
        parts = []
    budgets: dict[str, float] = {}
    if parts:
        from plan import GPU, SMOKE

        cuda = torch.cuda.is_available()  # asks the driver for a count; no context is made here
        report.header["plan"] = "gpu" if cuda and not args.smoke else "smoke (tiny sizes)"
        budgets = (GPU if cuda and not args.smoke else SMOKE).budgets
    planned_end = time.monotonic()
    for index, part in enumerate(parts):
        planned_end += budgets[part]
        # the last part takes what is left of --minutes: a run of a few parts given more minutes
        # than their seconds gives them to its last (torch.compile's, whose compiling can outlast 60 s)
        end = deadline if index == len(parts) - 1 else min(planned_end, deadline)
        seconds = end - time.monotonic()
        if seconds < MINIMUM_SECONDS:
            report.add(Row(part, "(the whole part)", NOT_RUN,
                           f"the time budget was spent ({max(deadline - time.monotonic(), 0):.0f} s of "
                           f"{60 * args.minutes:.0f} left)"))
            continue
        start = time.monotonic()
        run_in_process(part, args=args, seconds=seconds, report=report, env=env, work=work)
        report.parts_s[part] = time.monotonic() - start
        print(f"{part}: {report.parts_s[part]:.0f} s (limit {seconds:.0f} s)", flush=True)
    report.write()
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)  # the data, weights files and runs the parts made
    counts = report.counts()
    print(f"done in {60 * args.minutes - STOP_RESERVE - (deadline - time.monotonic()):.0f} s: "
          + ", ".join(f"{n} {status}" for status, n in counts.items()) + f"; {args.out / 'gpu.md'}", flush=True)
    return 1 if counts[FAILED] else 0


if __name__ == "__main__":
    raise SystemExit(main())
