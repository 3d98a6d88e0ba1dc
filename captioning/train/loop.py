"""Training, top to bottom: `fit` starts a run and fits it; a run is built in small named steps.

Notation: B batch, T caption steps, L grid cells, D channels, S input side.

    fit(config)
      Hardware.setup         where it computes: device, processes, precision (hardware.py)
      Run.start              the checkpoint to resume (or warm-start from), the data, build_model,
                             build_optimizer (build.py), restore (or warm_start)
      Run.fit                epochs of Run.step (one optimizer step: the objective's loss, objective.py,
                             paper_objective.py, scst.py, applied by step.py), Run.validation_round
                             after each epoch (and every train.eval_every_steps), checkpoints
                             (captioning/checkpoint.py)

Under torchrun the processes agree, once per step, on everything that changes their path (stop
signals, non-finite losses, empty parts of a batch: distributed.agree), so none waits on another.

With a frozen encoder the annotations are cached and a step is decoder-only; with
`encoder.fine_tune_from` the encoder runs on the fly on images and its later stages train with their
own learning rate. Model selection, learning-rate decay and early stopping all use a metric of
*decoded* validation captions (greedy), never a teacher-forced loss: a teacher-forced loss can keep
falling while the captions the model actually produces stop improving.
"""

from __future__ import annotations

import gc
import math
import random
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioning.checkpoint import load_checkpoint, run_weights, save_checkpoint
from captioning.config import Config
from captioning.config.registry import OBJECTIVES
from captioning.data.dataset import rank_batches
from captioning.data.run_data import RunData, load_run_data
from captioning.model.encoder_decoder import EncoderDecoder
from captioning.progress import bar
from captioning.runtime import distributed
from captioning.runtime.hardware import Hardware
from captioning.runtime.signals import StopSignalHandler
from captioning.train.build import RunModel, build_encoder, build_model, build_optimizer
from captioning.train.objective import Objective, TrainingError
from captioning.train.provenance import run_record_of, versions
from captioning.train.resume import LastCheckpoint, Progress, carry_over, restore_run, run_payload
from captioning.train.run_folder import RunLog, run_folder
from captioning.train.step import Stepping
from captioning.train.validation import report, validation_metrics
from captioning.train.warm_start import refuse_what_no_warm_start_takes, warm_start, warm_vocabulary


class Run:
    """One training run: its data, model, optimizer, progress and logs, and what it does with them."""

    def __init__(self, config: Config, *, hardware: Hardware, data: RunData, model: RunModel,
                 optimizer: torch.optim.Optimizer, scheduler: Any):
        t = config.train
        self.config, self.hardware, self.data, self.model = config, hardware, data, model
        self.context, self.device = hardware.context, hardware.device
        self.out = Path(t.out_dir)
        self.optimizer, self.scheduler = optimizer, scheduler
        self.scaler = hardware.precision.scaler()
        self.progress = Progress()
        self.signals: StopSignals | None = None  # set by fit
        self.agreement = distributed.Agreement()  # what the processes agreed on at the last step
        self.module: nn.Module | None = None  # the trained graph, wrapped in DDP under torchrun (start)
        self.objective: Objective | None = None  # train.objective (start)
        self.stepping: Stepping | None = None  # how each of its steps is taken (start)
        self.log: RunLog | None = None
        self.record: dict[str, Any] | None = None  # written into every checkpoint (save)
        self.measure_anew = False  # a resume under another validation (resume.carry_over)
        self.started = time.time()

    @classmethod
    def start(cls, config: Config, *, resume: bool, hardware: Hardware, last: LastCheckpoint | None = None) -> Run:
        """Build the run in order: checkpoint, data, model, optimizer; then restore and wrap. `last`:
        OUT_DIR/last.pt to resume from, as fit read it before taking the folder (read here otherwise)."""
        t, device = config.train, hardware.device
        if hardware.context.is_main:  # the commit of the code this run loaded, not the one at its first save
            versions()
        Path(t.out_dir).mkdir(parents=True, exist_ok=True)
        checkpoint = (last or LastCheckpoint.read(config)).latest(config) if resume else None
        source = load_checkpoint(t.init_from) if checkpoint is None and t.init_from else None  # a warm start
        vocab_words = checkpoint["vocab"] if checkpoint else None
        if source is not None:
            vocab_words = warm_vocabulary(config, source, t.init_from)
        torch.manual_seed(t.seed)  # before any model is built
        random.seed(t.seed)
        encoder = build_encoder(config, device, hardware.context)
        if source is not None:  # before any data is read or cached
            refuse_what_no_warm_start_takes(source, t.init_from, fine_tunes=encoder is not None and encoder.trainable)
        data = load_run_data(config, vocab_words=vocab_words, encoder=encoder, context=hardware.context,
                             device=device)
        model = build_model(config, data, encoder, device)
        optimizer, scheduler = build_optimizer(config, model)
        if t.objective == "scst" and hardware.context.enabled:
            raise TrainingError("train.objective=scst runs in one process for now (not under torchrun)")
        run = cls(config, hardware=hardware, data=data, model=model, optimizer=optimizer, scheduler=scheduler)
        if checkpoint is not None:
            run.restore(checkpoint)
            carried = carry_over(config, checkpoint, optimizer=optimizer, scheduler=scheduler, progress=run.progress,
                                 path=run.out / "last.pt")
            for line in carried.said if hardware.context.is_main else ():
                tqdm.write(line, file=sys.stderr)
            run.measure_anew = carried.measure_anew
        elif source is not None:
            warm_start(model, source, t.init_from, config=config, say=hardware.context.is_main)
        if checkpoint is None and hardware.context.rank:  # other processes: other dropout masks, from the seed
            torch.manual_seed(t.seed + 1000 * hardware.context.rank)
        run.module = distributed.wrapped(EncoderDecoder(decoder=model.decoder, encoder=model.encoder),
                                         hardware.context, device)
        run.objective = OBJECTIVES[t.objective](config, data=data, model=model, module=run.module, hardware=hardware)
        run.stepping = Stepping(config, objective=run.objective, model=model, module=run.module, optimizer=optimizer,
                                scaler=run.scaler, hardware=hardware, training_images=len(data.train.records))
        if checkpoint is not None:  # hard attention's baseline (the REINFORCE state of its objective)
            run.objective.load_state_dict(checkpoint.get("reinforce", {}))
        if hardware.context.is_main:
            run.log = RunLog(run.out, resumed_at=run.progress.step if checkpoint is not None else None)
        # A resumed run's clock goes on from its checkpoint's: history and fit() report the time trained in all.
        run.started = time.time() - run.progress.seconds
        return run

    # checkpoints

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Go on exactly where the checkpoint stopped (train/resume.py)."""
        self.progress = restore_run(checkpoint, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                    scaler=self.scaler, context=self.context, device=self.device,
                                    seed=self.config.train.seed, path=self.out / "last.pt")

    def save(self, *, best: bool = False) -> None:
        if self.context.is_main:
            distributed.now_doing(self.context, f"saving a checkpoint at step {self.progress.step}")
            self.progress.seconds = time.time() - self.started
            payload = run_payload(config=self.config, vocab=self.data.vocab, model=self.model, optimizer=self.optimizer,
                                  scheduler=self.scheduler, scaler=self.scaler, progress=self.progress,
                                  objective_state=self.objective.state_dict(), device=self.device)
            if self.record is None:  # what made the run (train/provenance.py), once: it asks Java and git
                self.record = run_record_of(self.config, self.data)
            payload["record"] = {**self.record, "weights": run_weights(payload)}
            # best.pt first: last.pt records the best metric, and a kill between the two saves must not
            # leave a last.pt that says a better model is kept than best.pt holds (a resume would only
            # replace best.pt on a value above it). This way round, a resume repeats the validation.
            if best:
                save_checkpoint(self.out / "best.pt", payload)
            save_checkpoint(self.out / "last.pt", payload)

    # training

    def loader(self, batches: list[list[int]]) -> DataLoader:
        t = self.config.train
        # Its own generator: a DataLoader otherwise draws its worker seed from the global RNG each
        # epoch, so a resumed run (one more DataLoader) would get different dropout masks.
        return DataLoader(self.objective.items, batch_sampler=batches, collate_fn=self.objective.collate,
                          num_workers=t.num_workers, pin_memory=t.pin_memory and self.hardware.pin_memory,
                          generator=torch.Generator().manual_seed(t.seed))

    def step(self, batch: Any, *, size: int) -> dict[str, float] | None:
        """One optimizer step of the objective on this process's part of a global batch of `size`;
        the numbers to log, or None (a skipped step, or nothing of the batch here)."""
        result = self.stepping(batch, step=self.progress.step, size=size,
                               received=self.signals.received if self.signals else None)
        self.agreement = result.agreement
        applied = self.progress.count(result, max_bad_steps=self.config.train.max_bad_steps)
        # The weights' average (train.ema_decay) follows applied steps only: a skipped step changed no
        # weight, and counting it would pull the average towards weights it already holds.
        if applied and self.model.average is not None:
            self.model.average.update(self.model.decoder)
        # A skipped step's numbers are not finite or not applied: its warning names them, the logs do not.
        return {**result.losses, "skipped_steps": float(self.progress.skipped_steps)} \
            if applied and result.losses else None

    def stop_signal(self) -> int | None:
        """The stop signal to act on: this process's own alone, the one the processes agreed on under torchrun."""
        if not self.context.enabled:
            return self.signals.received if self.signals else None
        return self.agreement.signal

    def fit(self, signals: StopSignals) -> str | None:
        """Epochs until done, early stopping or a signal; returns the signal's name if one stopped it."""
        t, progress = self.config.train, self.progress
        self.signals = signals
        stop = early_stopped = False
        if self.measure_anew and self.validated_at_this_step():
            # Resumed under another validation from a checkpoint its last validation wrote: measured
            # now, the checkpoint's model is the first best (however the run goes on: a run at its
            # step or epoch limit trains no further, and would validate no more).
            self.validation_round()
        while progress.epoch < t.epochs and not stop:
            global_batches = self.objective.batches(progress.epoch)
            batches = rank_batches(global_batches, rank=self.context.rank, world_size=self.context.world_size)
            bar = self.progress_bar(batches)
            for batch in bar:
                if t.max_steps is not None and progress.step >= t.max_steps:  # resumed at the limit (killed
                    stop = True  # between its last step and its exit): validate, save, and stop
                    break
                distributed.now_doing(self.context, f"training, step {progress.step + 1} (epoch {progress.epoch + 1})")
                losses = self.step(batch, size=len(global_batches[progress.batch_in_epoch]))
                progress.step += 1
                progress.batch_in_epoch += 1
                if losses is not None:
                    bar.set_postfix(loss=f"{losses['loss']:.3f}")
                    self.log_losses(losses)
                if t.max_steps is not None and progress.step >= t.max_steps:
                    stop = True
                    break
                mid_epoch = progress.batch_in_epoch < len(batches)
                if t.eval_every_steps and progress.step % t.eval_every_steps == 0 and mid_epoch:
                    stop = early_stopped = self.validation_round()
                    if stop:
                        break
                elif t.save_every_steps and progress.step % t.save_every_steps == 0:
                    self.save()  # a place to resume from after a kill (SIGKILL cannot be caught)
                if self.stop_signal() is not None and mid_epoch:  # at an epoch's end: validate first
                    self.save()
                    return signal.Signals(self.stop_signal()).name
            if progress.batch_in_epoch >= len(batches):
                progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
            if not early_stopped and not self.validated_at_this_step():
                stop = self.validation_round() or stop
            if self.context.enabled:
                signum = distributed.agree_signal(self.context, signals.received)
                self.agreement = distributed.Agreement(signal=signum)
            if self.stop_signal() is not None:  # validate wrote last.pt
                return signal.Signals(self.stop_signal()).name
        return None

    def log_losses(self, losses: dict[str, float]) -> None:
        if self.log is not None and self.progress.step % self.config.train.log_every_steps == 0:
            self.log.losses(step=self.progress.step, epoch=self.epoch_of_last_step(), losses=losses,
                            lrs=[group["lr"] for group in self.optimizer.param_groups],
                            skipped=self.progress.skipped_images)

    def epoch_of_last_step(self) -> int:
        """The epoch, counted from 1 as the progress bar counts it, of the step just done: the one
        training is in, or the one it has just finished (`progress.epoch` counts the epochs finished)."""
        return self.progress.epoch if self.progress.batch_in_epoch == 0 else self.progress.epoch + 1

    def progress_bar(self, batches: list[list[int]]) -> Iterable:
        """The epoch's batches not yet done, loaded, behind a progress bar on the main process."""
        done = self.progress.batch_in_epoch
        return bar(self.loader(batches[done:]), desc=f"epoch {self.progress.epoch + 1}", unit="batch", initial=done,
                   total=len(batches), leave=False, show=None if self.context.is_main else False)

    # validation

    def validated_at_this_step(self) -> bool:
        """Whether the last validation was at this step: a run resumed from the last.pt a validation
        wrote (at its step limit, validating again would log the step twice and count it as stale: a
        decay, an early stop; under another validation, fit measures that model first)."""
        return bool(self.progress.history) and self.progress.history[-1]["step"] == self.progress.step

    def validation_round(self) -> bool:
        """Validate (every process its part), decay the learning rate, keep the best; True when it is
        time to stop early."""
        t, progress = self.config.train, self.progress
        distributed.now_doing(self.context, f"validating at step {progress.step}")
        metrics = validation_metrics(self.model.validated, self.data.val, self.data.vocab, self.config,
                                     device=self.device, annotations=self.data.val_annotations,
                                     context=self.context) or {}
        value = distributed.broadcast_float(self.context, metrics.get(t.val_metric, math.nan))
        # Not measured (NaN: attention_correctness where the data has no boxes, relation_accuracy before
        # the captions name a relation) is neither better nor worse: no decay, no stale count.
        measured = not math.isnan(value)
        if measured:
            self.scheduler.step(value)
        progress.history.append({"step": progress.step, "epoch": progress.epoch, **metrics, t.val_metric: value,
                                 "lr": self.optimizer.param_groups[0]["lr"], "seconds": time.time() - self.started})
        improved = measured and value > progress.best_metric
        if improved:
            progress.best_metric, progress.stale_evaluations = value, 0
        elif measured:
            progress.stale_evaluations += 1
        if self.log is not None:
            distributed.now_doing(self.context, f"writing the logs and checkpoints of step {progress.step}")
            report(self.log, metrics, improved=improved, step=progress.step, epoch=self.epoch_of_last_step(),
                   decoder=self.model.validated, data=self.data, config=self.config, device=self.device)
        self.save(best=improved)
        return progress.stale_evaluations >= t.early_stop_patience

    def close(self) -> None:
        """Close the logs and release the training module, before the process group goes."""
        if self.log is not None:
            self.log.close()
        # DDP's reducer holds the gloo process group. Left to the interpreter's exit (the Run sits in
        # reference cycles), it is destroyed after destroy_process_group, and gloo's threads can abort
        # the process ("terminate called without an active exception", SIGABRT).
        self.module = self.objective = self.stepping = None
        if self.context.enabled:
            gc.collect()

    def summary(self, interrupted: str | None) -> dict[str, Any]:
        # No best where the metric was never measured (NaN at every validation): a best.pt in the folder
        # is then an earlier run's.
        kept = math.isfinite(self.progress.best_metric)
        return {"best_metric": self.progress.best_metric, "metric": self.config.train.val_metric,
                "steps": self.progress.step, "seconds": time.time() - self.started,
                "best": str(self.out / "best.pt") if kept else None,
                "last": str(self.out / "last.pt"), "interrupted": interrupted,
                "skipped_images": self.progress.skipped_images}


def fit(config: Config, *, resume: bool = False, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Train as configured; returns the best validation metric, the checkpoint paths and the
    seconds trained (in all: a resumed run counts those before its checkpoint too).

    Under torchrun (WORLD_SIZE > 1) every process calls this; they train one model together.
    """
    t = config.train
    hardware = Hardware.setup(device, amp=t.amp, tf32=t.tf32, timeout=t.dist_timeout)
    if t.amp and hardware.context.is_main:  # what train.amp turned into on this device, and why
        tqdm.write(f"precision: {hardware.precision.reason}", file=sys.stderr)
    try:
        # Read, and a resume of another model refused, before the run takes its folder: a refused
        # resume writes nothing there (train/resume.py).
        last = LastCheckpoint.read(config) if resume else None
        with run_folder(config.train.out_dir, resume=resume, enabled=hardware.context.is_main):  # one run per folder
            run = Run.start(config, resume=resume, hardware=hardware, last=last)
            try:
                with StopSignals() as signals:
                    interrupted = run.fit(signals)
            finally:
                run.close()
    finally:
        hardware.teardown()
    return run.summary(interrupted)


# stopping cleanly on SIGTERM and SIGINT -----------------------------------------------------------
# Stopping cleanly on SIGTERM / SIGINT: the training loop saves a checkpoint and returns.

class StopSignals(StopSignalHandler):
    """SIGTERM / SIGINT (a cluster's preemption, Ctrl-C) ask the loop to save and stop after the
    current step; a second Ctrl-C interrupts at once."""

    def __init__(self):
        super().__init__()
        self.received: int | None = None

    def handle(self, signum: int) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum
        tqdm.write(f"{signal.Signals(signum).name}: saving a checkpoint after this step, then stopping",
                   file=sys.stderr)
