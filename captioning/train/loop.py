"""Training, top to bottom: `fit` starts a run and fits it; a run is built in small named steps.

Notation: B batch, T caption steps, L grid cells, D channels, S input side.

    fit(config)
      Hardware.setup         where it computes: device, processes, precision (hardware.py)
      Run.start              the checkpoint to resume (or warm-start from), the data, build_model,
                             build_optimizer (build.py), restore (or warm_start)
      Run.fit                epochs of Run.step (one optimizer step: step.py), Run.validate after each
                             epoch (and every train.eval_every_steps), checkpoints (checkpoint.py)

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioning.checkpoint import load_checkpoint, save_checkpoint
from captioning.config import Config
from captioning.data.dataset import Batch
from captioning.data.karpathy import too_many_unreadable
from captioning.data.loading import RunData, load_run_data
from captioning.data.mirror import mirror_batches
from captioning.data.sampling import epoch_batches, rank_batches
from captioning.data.vocab import Vocabulary
from captioning.progress import bar
from captioning.runtime import distributed
from captioning.runtime.hardware import Hardware
from captioning.train.build import Model, build_encoder, build_model, build_optimizer
from captioning.train.extras.word_weights import word_weight_vector
from captioning.train.lock import run_folder
from captioning.train.logs import RunLog
from captioning.train.losses import Reinforce
from captioning.train.scst import ImageBatch, SelfCritical, TrainingImages, collate_images, image_batches
from captioning.train.signals import StopSignals
from captioning.train.step import TrainingError, TrainingModel, row_draws, stand_in_batch, train_step
from captioning.train.validation import hard_choice, log_overlays, validate
from captioning.train.warm_start import warm_start, warm_vocabulary


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint so that a resumed run continues exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of `epoch` already done (this process's list, see data.sampling)
    best_metric: float = -math.inf
    stale_evaluations: int = 0  # evaluations since the best one, for early stopping
    history: list[dict[str, float]] = field(default_factory=list)
    skipped_images: int = 0  # training pairs left out because their image could not be read
    skipped_steps: int = 0  # steps not applied because their loss or gradient was not finite
    bad_steps_in_a_row: int = 0
    seconds: float = 0.0  # wall-clock seconds trained up to this point, summed over resumed runs


class Run:
    """One training run: its data, model, optimizer, progress and logs, and what it does with them."""

    def __init__(self, config: Config, *, hardware: Hardware, data: RunData, model: Model,
                 optimizer: torch.optim.Optimizer, scheduler: Any):
        t = config.train
        self.config, self.hardware, self.data, self.model = config, hardware, data, model
        self.context, self.device = hardware.context, hardware.device
        self.out = Path(t.out_dir)
        self.optimizer, self.scheduler = optimizer, scheduler
        self.scaler = hardware.precision.scaler()
        # Hard attention's REINFORCE terms and moving-average baseline (kept in checkpoints). Soft
        # attention samples nothing: no REINFORCE terms, and no repeated rows for train.reinforce.samples.
        self.reinforce = Reinforce.from_config(t.reinforce) if config.model.attention == "hard" else None
        if self.reinforce is not None:  # one baseline for all processes: the one-process baseline
            self.reinforce.across = lambda tensor: distributed.summed(self.context, tensor)
        self.word_weights = word_weight_vector(t.word_weights, data.vocab).to(self.device) if t.word_weights else None
        # train.objective=scst: batches of images and the self-critical loss instead of caption pairs (train/scst.py).
        self.scst = (SelfCritical.from_config(t.scst, records=data.train.records, vocab=data.vocab,
                                              max_length=config.decode.max_length) if t.objective == "scst" else None)
        self.progress = Progress()
        self.global_sizes: list[int] = []  # the sizes of the epoch's global batches (epoch_batches)
        self.signals: StopSignals | None = None  # set by fit
        self.agreement = distributed.Agreement()  # what the processes agreed on at the last step
        self.unreadable: set[str] = set()  # training images named as unreadable (encoder on the fly)
        self.module: nn.Module | None = None  # the trained graph, wrapped in DDP under torchrun
        self.log: RunLog | None = None
        self.started = time.time()

    @classmethod
    def start(cls, config: Config, *, resume: bool, hardware: Hardware) -> Run:
        """Build the run in order: checkpoint, data, model, optimizer; then restore and wrap."""
        t, device = config.train, hardware.device
        Path(t.out_dir).mkdir(parents=True, exist_ok=True)
        checkpoint = load_checkpoint(Path(t.out_dir) / "last.pt") if resume else None
        source = load_checkpoint(t.init_from) if checkpoint is None and t.init_from else None  # a warm start
        vocab_words = checkpoint["vocab"] if checkpoint else None
        if source is not None:
            vocab_words = warm_vocabulary(config, source, t.init_from)
        torch.manual_seed(t.seed)  # before any model is built
        random.seed(t.seed)
        encoder = build_encoder(config, device, hardware.context)
        data = load_run_data(config, vocab_words=vocab_words, encoder=encoder, context=hardware.context,
                             device=device)
        model = build_model(config, data, encoder, device)
        optimizer, scheduler = build_optimizer(config, model)
        if t.objective == "scst" and hardware.context.enabled:
            raise TrainingError("train.objective=scst runs in one process for now (not under torchrun)")
        run = cls(config, hardware=hardware, data=data, model=model, optimizer=optimizer, scheduler=scheduler)
        if checkpoint is not None:
            run.restore(checkpoint)
        elif source is not None:
            warm_start(model, source, t.init_from)
        if checkpoint is None and hardware.context.rank:  # other processes: other dropout masks, from the seed
            torch.manual_seed(t.seed + 1000 * hardware.context.rank)
        run.module = run.wrap(TrainingModel(decoder=model.decoder, encoder=model.encoder))
        if hardware.context.is_main:
            run.log = RunLog(run.out, resumed_at=run.progress.step if checkpoint is not None else None)
        # A resumed run's clock goes on from its checkpoint's: history and fit() report the time trained in all.
        run.started = time.time() - run.progress.seconds
        return run

    def wrap(self, module: nn.Module) -> nn.Module:
        """DistributedDataParallel under torchrun; the module itself otherwise."""
        if self.context.enabled:
            device_ids = [self.device] if self.device.type == "cuda" else None
            module = nn.parallel.DistributedDataParallel(module, device_ids=device_ids)
        return module

    # checkpoints

    def payload(self) -> dict[str, Any]:
        model = self.model
        self.progress.seconds = time.time() - self.started
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.device.type == "cuda":  # this process's GPU only: a run may resume on fewer or more GPUs
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        payload = {
            "config": self.config.to_dict(), "vocab": self.data.vocab.words, "grid": list(model.grid),
            "annotation_dim": model.annotation_dim, "decoder": model.validated.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(), "progress": vars(self.progress).copy(), "rng": rng,
            "reinforce": self.reinforce.state_dict() if self.reinforce else {},  # hard attention's baseline
        }
        if model.average is not None:  # "decoder" is the average; resuming needs the trained weights too
            payload["training_decoder"] = model.decoder.state_dict()
        if model.encoder is not None and model.encoder.trainable:
            payload["encoder"] = model.encoder.state_dict()
        return payload

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Go on exactly where the checkpoint stopped: weights, optimizer, schedule, progress, RNG."""
        model = self.model
        model.decoder.load_state_dict(checkpoint.get("training_decoder", checkpoint["decoder"]))
        if model.average is not None and "training_decoder" in checkpoint:
            model.average.load_state_dict(checkpoint["decoder"])
        if "encoder" in checkpoint and model.encoder is not None:
            model.encoder.load_state_dict(checkpoint["encoder"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        if checkpoint.get("scaler"):
            self.scaler.load_state_dict(checkpoint["scaler"])
        self.progress = Progress(**checkpoint["progress"])
        if self.reinforce is not None:
            self.reinforce.load_state_dict(checkpoint.get("reinforce", {}))
        if self.context.rank == 0:  # rank 0's stream; the others start theirs anew (docs/coco.md)
            torch.set_rng_state(checkpoint["rng"]["torch"])
            random.setstate(checkpoint["rng"]["python"])
            cuda = checkpoint["rng"].get("cuda")
            if isinstance(cuda, list):  # written by older versions: every GPU's state; the first was rank 0's
                cuda = cuda[0] if cuda else None
            if cuda is not None and self.device.type == "cuda":
                torch.cuda.set_rng_state(cuda, self.device)
        else:
            torch.manual_seed(self.config.train.seed + 1000 * self.context.rank + self.progress.step)

    def save(self, *, best: bool = False) -> None:
        if self.context.is_main:
            distributed.now_doing(self.context, f"saving a checkpoint at step {self.progress.step}")
            payload = self.payload()
            save_checkpoint(self.out / "last.pt", payload)
            if best:
                save_checkpoint(self.out / "best.pt", payload)

    # training

    def loader(self, batches: list[list[int]]) -> DataLoader:
        t = self.config.train
        items, collate = (self.data.pairs, self.data.collate) if self.scst is None else (
            TrainingImages(self.data.train.annotations), collate_images)
        # Its own generator: a DataLoader otherwise draws its worker seed from the global RNG each
        # epoch, so a resumed run (one more DataLoader) would get different dropout masks.
        return DataLoader(items, batch_sampler=batches, collate_fn=collate,
                          num_workers=t.num_workers, pin_memory=t.pin_memory and self.hardware.pin_memory,
                          generator=torch.Generator().manual_seed(t.seed))

    def epoch_batches(self) -> list[list[int]]:
        """This process's batches of the current epoch: a function of (seed, epoch) alone."""
        t, epoch, lengths = self.config.train, self.progress.epoch, self.data.pairs.lengths
        if self.scst is not None:  # images, not caption pairs
            batches = image_batches(len(self.data.train.records), batch_size=t.batch_size, seed=t.seed, epoch=epoch)
            return rank_batches(batches, rank=self.context.rank, world_size=self.context.world_size)
        batches = epoch_batches(lengths, batch_size=t.batch_size, seed=t.seed, epoch=epoch,
                                bucket=self.config.data.bucket_batches)
        if self.config.data.mirror:  # data/mirror.py (not in the paper)
            batches = mirror_batches(batches, pairs=len(lengths), seed=t.seed, epoch=epoch)
        self.global_sizes = [len(batch) for batch in batches]
        return rank_batches(batches, rank=self.context.rank, world_size=self.context.world_size)

    def step(self, batch: Batch | ImageBatch) -> dict[str, float] | None:
        """One optimizer step, counting those skipped as not finite (see apply_gradients)."""
        losses = self._step(batch)
        if losses is None or self.agreement.empty:  # no image in this process's part (or in any)
            return None
        progress = self.progress
        own = losses.pop("own", 1.0)
        skipped = losses.pop("skipped")
        if skipped:
            progress.skipped_steps += 1
            progress.bad_steps_in_a_row += 1
            tqdm.write(f"warning: step {progress.step + 1}: loss {losses['loss']:.4g}, gradient norm "
                       f"{losses['grad_norm']:.4g}: not finite (here or in another process), step skipped",
                       file=sys.stderr)
            if progress.bad_steps_in_a_row >= self.config.train.max_bad_steps:
                raise TrainingError(f"step {progress.step + 1}: the loss or its gradient was not finite "
                                    f"{progress.bad_steps_in_a_row} steps in a row ({progress.skipped_steps} skipped "
                                    "in all); stopping, the last good checkpoint is kept")
        else:
            progress.bad_steps_in_a_row = 0
        # A skipped step's numbers are not finite or not applied: the warning above names them, the
        # logs keep the steps that trained (and the count of those that did not).
        return {**losses, "skipped_steps": float(progress.skipped_steps)} if own and not skipped else None

    def name_unreadable(self, reasons: list[str]) -> None:
        """Images the encoder on the fly could not read: each named once in the run, and the run
        stopped when they are more than data.max_bad_images of the training images. Under torchrun
        every process is given every process's (Run._step), so all of them stop together."""
        new = [reason for reason in reasons if reason not in self.unreadable]
        for reason in new if self.context.is_main else ():
            tqdm.write(f"warning: skipping an unreadable image (from now on, quietly): {reason}", file=sys.stderr)
        self.unreadable.update(new)
        problem = too_many_unreadable("train", sorted(self.unreadable), len(self.data.train.records),
                                      limit=self.config.data.max_bad_images) if new else None
        if problem is not None:
            raise TrainingError(problem)

    def _step(self, batch: Batch | ImageBatch) -> dict[str, float] | None:
        """One optimizer step on this process's part of a global batch (None: no readable image in it).

        Under torchrun a process whose part is empty still takes the step, on a stand-in batch whose
        terms weigh nothing, so that every process meets the same collectives."""
        t = self.config.train
        if self.scst is not None:
            losses = self.scst.step(self.model.decoder, batch.to(self.device), self.optimizer, grad_clip=t.grad_clip,
                                    step=self.progress.step, precision=self.hardware.precision,
                                    scaler=self.scaler if self.scaler.is_enabled() else None,
                                    hard_choice=hard_choice(self.config))
            self.average(skipped=bool(losses["skipped"]))
            return losses
        new = [reason for reason in dict.fromkeys(batch.failures) if reason not in self.unreadable]
        own = batch.tokens.shape[0] > 0
        if not self.context.enabled:
            self.name_unreadable(new)
            self.progress.skipped_images += len(batch.failures)
            if not own:
                return None
        batch_failures = batch.failures
        counts = {"words": 0.0, "images": 0.0}
        if own and self.context.enabled:  # counted before the batch moves: no wait for the device
            counts = {"words": float((batch.tokens[:, 1:] != Vocabulary.pad_id).sum()), "images": batch.tokens.shape[0]}
        batch = (batch if own else self.stand_in()).to(self.device, non_blocking=True)
        if self.reinforce is not None:
            self.reinforce.counted = own

        def agree(loss: torch.Tensor) -> distributed.Agreement:
            agreement = distributed.agree(self.context, **counts, loss=loss if own else None,
                                          received=self.signals.received if self.signals else None,
                                          unreadable=len(batch_failures), named=len(new))
            self.agreement = agreement
            return agreement

        losses = train_step(self.module, batch, self.optimizer, grad_clip=t.grad_clip, ds_lambda=t.ds_lambda,
                            ds_target=t.ds_target, precision=self.hardware.precision,
                            scaler=self.scaler if self.scaler.is_enabled() else None, agree=agree,
                            reinforce=self.reinforce, word_weights=self.word_weights, step=self.progress.step,
                            draws=self.draws(rows=batch.tokens.shape[0], positions=batch.positions))
        self.average(skipped=bool(losses["skipped"]))
        if self.context.enabled:  # the global batch's unreadable images, the same on every process
            self.progress.skipped_images += self.agreement.unreadable
            if self.agreement.named:
                self.name_unreadable([reason for part in distributed.everyone(self.context, new) for reason in part])
        return {**losses, "own": float(own)}

    def average(self, *, skipped: bool) -> None:
        """The weights' average (train.ema_decay) moves after an applied step only: a skipped step
        changed no weight, and counting it would pull the average towards weights it already holds."""
        if self.model.average is not None and not skipped:
            self.model.average.update(self.model.decoder)

    def stand_in(self) -> Batch:
        """What a process with an empty part of a global batch steps on (its terms get a share of 0)."""
        if self.model.encoder is not None:
            return stand_in_batch(images=(3, self.config.data.image_size, self.config.data.image_size))
        return stand_in_batch(annotations=(self.model.grid[0] * self.model.grid[1], self.model.annotation_dim))

    def draws(self, *, rows: int, positions: torch.Tensor | None = None) -> torch.Tensor | None:
        """Hard attention's uniform draws for this process's rows of the global batch now being
        stepped (step.row_draws); None for soft attention, which samples nothing. `positions`: where
        each row sits in this process's part, when pairs with unreadable images were left out."""
        if self.reinforce is None:
            return None
        size = self.global_sizes[self.progress.batch_in_epoch]
        start, _ = self.context.shard(size)  # where this process's part of the batch begins
        return row_draws(seed=self.config.train.seed, step=self.progress.step, size=size, start=start,
                         rows=rows, samples=self.reinforce.samples, width=self.config.data.max_caption_length + 2,
                         coin=self.config.model.hard.coin, positions=positions).to(self.device, non_blocking=True)

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
        while progress.epoch < t.epochs and not stop:
            batches = self.epoch_batches()
            bar = self.progress_bar(batches)
            for batch in bar:
                if t.max_steps is not None and progress.step >= t.max_steps:  # resumed at the limit (killed
                    stop = True  # between its last step and its exit): validate, save, and stop
                    break
                distributed.now_doing(self.context, f"training, step {progress.step + 1} (epoch {progress.epoch})")
                losses = self.step(batch)
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
                    stop = early_stopped = self.validate()
                    if stop:
                        break
                elif t.save_every_steps and progress.step % t.save_every_steps == 0:
                    self.save()  # a place to resume from after a kill (SIGKILL cannot be caught)
                if self.stop_signal() is not None and mid_epoch:  # at an epoch's end: validate first
                    self.save()
                    return signal.Signals(self.stop_signal()).name
            if progress.batch_in_epoch >= len(batches):
                progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
            if not early_stopped:
                stop = self.validate() or stop
            if self.context.enabled:
                signum = distributed.agree_signal(self.context, signals.received)
                self.agreement = distributed.Agreement(signal=signum)
            if self.stop_signal() is not None:  # validate wrote last.pt
                return signal.Signals(self.stop_signal()).name
        return None

    def log_losses(self, losses: dict[str, float]) -> None:
        if self.log is not None and self.progress.step % self.config.train.log_every_steps == 0:
            self.log.losses(step=self.progress.step, epoch=self.progress.epoch, losses=losses,
                            lrs=[group["lr"] for group in self.optimizer.param_groups],
                            skipped=self.progress.skipped_images)

    def progress_bar(self, batches: list[list[int]]) -> Iterable:
        """The epoch's batches not yet done, loaded, behind a progress bar on the main process."""
        done = self.progress.batch_in_epoch
        return bar(self.loader(batches[done:]), desc=f"epoch {self.progress.epoch}", unit="batch", initial=done,
                   total=len(batches), leave=False, show=None if self.context.is_main else False)

    # validation

    def validate(self) -> bool:
        """Validate (every process its part), decay the learning rate, keep the best; True when it is
        time to stop early."""
        t, progress = self.config.train, self.progress
        distributed.now_doing(self.context, f"validating at step {progress.step}")
        metrics = validate(self.model.validated, self.data.val, self.data.vocab, self.config, device=self.device,
                           annotations=self.data.val_annotations, context=self.context) or {}
        value = distributed.broadcast_float(self.context, metrics.get(t.val_metric, math.nan))
        self.scheduler.step(value)
        progress.history.append({"step": progress.step, "epoch": progress.epoch, **metrics, t.val_metric: value,
                                 "lr": self.optimizer.param_groups[0]["lr"], "seconds": time.time() - self.started})
        improved = value > progress.best_metric
        if improved:
            progress.best_metric, progress.stale_evaluations = value, 0
        else:
            progress.stale_evaluations += 1
        if self.log is not None:
            distributed.now_doing(self.context, f"writing the logs and checkpoints of step {progress.step}")
            self.report(metrics, improved=improved)
        self.save(best=improved)
        return progress.stale_evaluations >= t.early_stop_patience

    def report(self, metrics: dict[str, float], *, improved: bool) -> None:
        """A validation's metrics and overlays to the logs, and one line to the terminal."""
        step, epoch = self.progress.step, self.progress.epoch
        self.log.validation(step=step, epoch=epoch, metrics=metrics)
        log_overlays(self.log.writer, self.model.validated, self.data.val, self.data.val_annotations, self.data.vocab,
                     count=self.config.train.log_images, max_length=self.config.decode.max_length, step=step,
                     device=self.device, hard_choice=hard_choice(self.config))
        shown = ("Bleu_4", "CIDEr", "attention_correctness")
        summary = ", ".join(f"{k} {metrics[k]:.3f}" for k in shown if k in metrics)
        tqdm.write(f"step {step} epoch {epoch}: {summary}{' (best)' if improved else ''}")

    def close(self) -> None:
        """Close the logs and release the training module, before the process group goes."""
        if self.log is not None:
            self.log.close()
        # DDP's reducer holds the gloo process group. Left to the interpreter's exit (the Run sits in
        # reference cycles), it is destroyed after destroy_process_group, and gloo's threads can abort
        # the process ("terminate called without an active exception", SIGABRT).
        self.module = None
        if self.context.enabled:
            gc.collect()

    def summary(self, interrupted: str | None) -> dict[str, Any]:
        return {"best_metric": self.progress.best_metric, "metric": self.config.train.val_metric,
                "steps": self.progress.step, "seconds": time.time() - self.started, "best": str(self.out / "best.pt"),
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
        with run_folder(config.train.out_dir, enabled=hardware.context.is_main):  # one run per folder
            run = Run.start(config, resume=resume, hardware=hardware)
            try:
                with StopSignals() as signals:
                    interrupted = run.fit(signals)
            finally:
                run.close()
    finally:
        hardware.teardown()
    return run.summary(interrupted)
