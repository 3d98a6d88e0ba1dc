"""benchmarks/gpu/gpu.py's whole runs: train.py under torchrun (NCCL on GPUs), stopped by a SIGTERM and
resumed; and a short real training of the embedded default on data made here, on the device and on
the CPU, from a second seed and with train.graph on the device, its time per epoch and its validation
numbers side by side (the graph's gap to the eager run beside the two seeds' gap).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from plan import REPO, Context, tiny_data
from report import NotRun

from captioning.checkpoint import load_checkpoint
from captioning.config import load_config

STEPS_BEFORE_SIGNAL = 3  # logged steps to wait for before the SIGTERM
MORE_STEPS = 4  # steps the resumed run takes


# ----------------------------------------------------------------------------------------------- torchrun

def torchrun(context: Context) -> None:
    """For one process, and for every GPU where there are several: a few steps, a SIGTERM to
    torchrun, the checkpoint it leaves, a resume that goes on from it."""
    device = context.device
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    backend = "nccl" if device.type == "cuda" else "gloo"
    counts = [1, gpus] if gpus > 1 else [1]
    names = [[f"torchrun --nproc_per_node {n} ({backend}): steps, SIGTERM, checkpoint",
              f"torchrun --nproc_per_node {n} ({backend}): --resume"] for n in counts]
    several = f"torchrun --nproc_per_node N ({backend}), N GPUs"
    context.cases.plan([name for pair in names for name in pair] + ([several] if gpus < 2 else []))
    for processes, (stop_name, resume_name) in zip(counts, names):
        out = context.work / f"torchrun_{processes}"
        stopped = context.cases.run(stop_name, lambda p=processes, o=out: run_until_signal(context, processes=p, out=o))
        if stopped is None:
            context.cases.run(resume_name, lambda: _not_run("nothing to resume: the stopped run failed"))
            continue
        context.cases.run(resume_name, lambda p=processes, o=out, s=stopped: resume(context, processes=p, out=o,
                                                                                     stopped_at=s["stopped_at_step"]))
    if gpus < 2:
        context.cases.run(several, lambda: _not_run(f"{gpus or 'no'} GPU{'s' if gpus != 1 else ''} here: "
                                                    "--nproc_per_node 1 only"))


def _not_run(why: str) -> dict:
    raise NotRun(why)


def _command(context: Context, *, processes: int, out: Path, extra: list[str], resume: bool = False) -> list[str]:
    root = tiny_data(context)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            str(REPO / "train.py"), "--device", context.device.type, *(["--resume"] if resume else []),
            f"data.root={root}", *context.plan.tiny, f"train.out_dir={out}", "train.log_every_steps=1",
            "train.dist_timeout=120", *extra]


def _logged_steps(out: Path) -> int:
    log = out / "log.jsonl"
    return sum('"step"' in line and '"validation"' not in line for line in log.read_text().splitlines()) \
        if log.exists() else 0


def _tail(text: str) -> str:
    """What went wrong, from a run's output: its first line that names an error other than
    torchrun's own report of a failed process, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and "elastic" not in line and "ChildFailed" not in line]
    return (errors or lines or [""])[0 if errors else -1][:300]


def run_until_signal(context: Context, *, processes: int, out: Path) -> dict:
    """train.py under torchrun until it has logged a few steps, then SIGTERM to torchrun (as a
    scheduler stops a job): every process saves after its step and exits; last.pt holds that step."""
    command = _command(context, processes=processes, out=out, extra=["train.max_steps=100000"])
    start = time.perf_counter()
    running = subprocess.Popen(command, cwd=context.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True, env={**os.environ, "CAPTIONING_QUIET": "1"})
    try:
        while _logged_steps(out) < STEPS_BEFORE_SIGNAL:
            if running.poll() is not None:
                raise RuntimeError(f"torchrun ended (exit code {running.returncode}) before {STEPS_BEFORE_SIGNAL} "
                                   f"steps: {_tail(running.stdout.read())}")
            time.sleep(0.05)
        first_steps = time.perf_counter() - start
        running.send_signal(signal.SIGTERM)
        output, _ = running.communicate(timeout=90)
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
    saved = load_checkpoint(out / "last.pt")
    step = saved["progress"]["step"]
    assert step >= STEPS_BEFORE_SIGNAL, f"last.pt holds step {step}, before the signal"
    assert "SIGTERM: saving a checkpoint" in output, f"no process said it saved on SIGTERM: {_tail(output)}"
    return {"stopped_at_step": step, "torchrun_exit": running.returncode, "seconds_to_steps": first_steps,
            "seconds": time.perf_counter() - start}


def resume(context: Context, *, processes: int, out: Path, stopped_at: int) -> dict:
    """`--resume` under torchrun: it goes on from last.pt's step and ends at the new limit."""
    target = stopped_at + MORE_STEPS
    command = _command(context, processes=processes, out=out, extra=[f"train.max_steps={target}"], resume=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=context.work, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CAPTIONING_QUIET": "1"})
    assert done.returncode == 0, f"exit code {done.returncode}: {_tail(done.stderr or done.stdout)}"
    step = load_checkpoint(out / "last.pt")["progress"]["step"]
    assert step == target, f"the resumed run ended at step {step}, not {target}"
    assert _logged_steps(out) == target, f"log.jsonl has {_logged_steps(out)} steps, not {target}"
    return {"resumed_from": stopped_at, "ended_at": step, "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------------------------- a short real training

def short_training(context: Context) -> None:
    """The embedded default (configs/shapes_soft.yaml) on shapes data made here: the data, its
    feature cache on the device, a few epochs on the device, one on the CPU."""
    plan, device = context.plan, context.device
    counts = plan.shapes_counts
    root = context.work / "shapes"
    names = [f"shapes data: {counts['train']} train, {counts['val']} val images at {plan.shapes_size}²",
             f"feature cache on the device ({device.type})",
             f"train {plan.device_epochs} epoch{'s' if plan.device_epochs > 1 else ''} on the device ({device.type})",
             "train 1 epoch on the CPU",
             f"train {plan.device_epochs} epoch{'s' if plan.device_epochs > 1 else ''} on the device ({device.type}), "
             "train.seed=1 (the seeds' spread)",
             f"train {plan.device_epochs} epoch{'s' if plan.device_epochs > 1 else ''} on the device ({device.type}), "
             "train.graph"]
    context.cases.plan(names)
    overrides = [f"data.root={root}", f"data.image_size={plan.shapes_size}", *plan.training]
    context.cases.run(names[0], lambda: make_data(root, counts=counts, image_size=plan.shapes_size))
    context.cases.run(names[1], lambda: cache_features(context, overrides))
    eager = context.cases.run(names[2], lambda: train(overrides, out=context.work / "train_device",
                                                      epochs=plan.device_epochs, device=device))
    context.cases.run(names[3], lambda: train(overrides, out=context.work / "train_cpu", epochs=1,
                                              device=torch.device("cpu")))
    # The device's run again from another seed, then with its steps replayed as CUDA graphs: the graph's
    # run draws its dropout over other positions (every row runs to its bucket's end), so it is another
    # draw of the same training, to be as near the eager run as another seed is.
    other = context.cases.run(names[4], lambda: train([*overrides, "train.seed=1"], out=context.work / "train_seed1",
                                                      epochs=plan.device_epochs, device=device))

    def graphed() -> dict:
        values = train([*overrides, "train.graph=true"], out=context.work / "train_graph", epochs=plan.device_epochs,
                       device=device)
        if eager and other:
            for metric in ("CIDEr", "Bleu_4"):
                values[f"{metric}_gap"] = abs(values[metric][-1] - eager[metric][-1])
                values[f"{metric}_seed_gap"] = abs(other[metric][-1] - eager[metric][-1])
        return values

    context.cases.run(names[5], graphed)


def make_data(root: Path, *, counts: dict[str, int], image_size: int) -> dict:
    from captioning.data.shapes.scenes import make_shapes

    start = time.perf_counter()
    make_shapes(root, counts, seed=0, image_size=image_size)
    return {"images": sum(counts.values()), "seconds": time.perf_counter() - start}


def cache_features(context: Context, overrides: list[str]) -> dict:
    """The encoder (EfficientNet-Lite0 at stride 16, its ImageNet weights) over every image, on the device."""
    from captioning.data.splits import load_splits

    config = load_config(None, overrides)
    workers = min(8, os.cpu_count() or 1) if context.device.type == "cuda" else 0
    start = time.perf_counter()
    splits = load_splits(config, ("train", "val"), device=context.device, num_workers=workers)
    seconds = time.perf_counter() - start
    images = sum(len(split.records) for split in splits.values())
    grid = splits["train"].grid
    return {"images": images, "images_per_s": images / seconds, "seconds": seconds, "reading_workers": workers,
            "annotations": f"{grid[0]}x{grid[1]}x{splits['train'].annotations.shape[2]}"}


def train(overrides: list[str], *, out: Path, epochs: int, device: torch.device) -> dict:
    """fit() for `epochs` epochs with validation after each; from the run's own history: the seconds
    of each epoch (its steps and its validation) and the validation numbers after it."""
    from captioning.train.loop import fit

    config = load_config(None, [*overrides, f"train.out_dir={out}", f"train.epochs={epochs}"])
    summary = fit(config, device=device)
    history = load_checkpoint(Path(summary["last"]))["progress"]["history"]
    ends = [entry["seconds"] for entry in history]
    epoch_seconds = [round(b - a, 2) for a, b in zip([0.0, *ends], ends)]
    after_each = {metric: [round(entry.get(metric, float("nan")), 4) for entry in history]
                  for metric in ("CIDEr", "Bleu_4")}  # the validation after each epoch
    return {"epoch_s": epoch_seconds, "steps": summary["steps"], **after_each,
            "threads": torch.get_num_threads(), "seconds": summary["seconds"]}
