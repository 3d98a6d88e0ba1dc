"""Training: the run (checkpoints, logs, signals, validation, the epoch loop) and fit.

Notation: B batch, T caption steps, L grid cells, D channels, S input side.

With a frozen encoder the annotations are cached and a training step is decoder-only; with
`encoder.fine_tune_from` the encoder runs on the fly on images and its later stages train with
their own learning rate. Model selection, learning-rate decay and early stopping all use a metric
of *decoded* validation captions (greedy), never a teacher-forced loss: a teacher-forced loss can
keep falling while the captions the model actually produces stop improving.

Layout, top to bottom: `Progress`; `Run` (state, checkpoints, logs, the epoch loop); `fit`.
Elsewhere: one optimizer step and the module it trains (training_step.py), validation and its
TensorBoard overlays (validation.py), the data of a run (data/loading.py, data/sampling.py), mixed
precision (precision.py), several processes (distributed.py), SIGTERM/SIGINT (stop_signals.py).
"""

from __future__ import annotations

import gc
import json
import math
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from captioning.config import Config
from captioning.data.dataset import Batch
from captioning.data.loading import load_run_data
from captioning.data.mirror import mirror_batches
from captioning.data.sampling import epoch_batches, rank_batches
from captioning.data.splits import uses_feature_cache
from captioning.data.vocab import Vocabulary
from captioning.model.captioner import build_decoder
from captioning.model.encoder import Encoder
from captioning.train import distributed
from captioning.train.checkpoint import load_checkpoint, save_checkpoint
from captioning.train.losses import Reinforce
from captioning.train.precision import precision_for
from captioning.train.signals import StopSignals
from captioning.train.step import TrainingModel, train_step, word_weight_vector
from captioning.train.validation import hard_choice, log_overlays, validate


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
    seconds: float = 0.0  # wall-clock seconds trained up to this point, summed over resumed runs


# the run -------------------------------------------------------------------------------------------


class Run:
    """The state of one training run and what it does with it."""

    def __init__(self, config: Config, *, resume: bool, context: distributed.Distributed, device: torch.device):
        t = config.train
        self.config, self.context, self.device = config, context, device
        self.out = Path(t.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        checkpoint = load_checkpoint(self.out / "last.pt") if resume else None

        on_the_fly = not uses_feature_cache(config)
        torch.manual_seed(t.seed)  # before any model is built: initial weights follow train.seed
        random.seed(t.seed)
        self.encoder = Encoder.from_config(config.encoder).to(device) if on_the_fly else None
        self.data = load_run_data(config, vocab_words=checkpoint["vocab"] if checkpoint else None,
                                  encoder=self.encoder, context=context, device=device)
        if self.encoder is not None:  # the grid the encoder gives at this input size
            with torch.no_grad():
                side = config.data.image_size
                self.grid = self.encoder.eval()(torch.zeros(1, 3, side, side, device=device))[1]
            self.data.val.grid = self.data.train.grid = self.grid
            annotation_dim = self.encoder.dim
        else:
            self.grid = self.data.train.grid
            annotation_dim = self.data.train.annotations.shape[2]
        self.annotation_dim = annotation_dim

        torch.manual_seed(t.seed)
        self.decoder = build_decoder(config.model, vocab_size=len(self.data.vocab), annotation_dim=annotation_dim,
                                     grid=self.grid, captions_per_image=t.reinforce.samples).to(device)
        # train.ema_decay: an exponential moving average of the decoder's weights (Polyak and
        # Juditsky, 1992; not in the paper), the model that is validated and kept. The greedy
        # validation metric moves by about 0.01 from epoch to epoch on the shapes data, and the best
        # checkpoint is one draw from that noise; the average is a smoother model to pick from.
        self.average = AveragedModel(self.decoder, multi_avg_fn=get_ema_multi_avg_fn(t.ema_decay)) \
            if t.ema_decay else None
        # Hard attention's REINFORCE terms and moving-average baseline (kept in checkpoints). Soft
        # attention samples nothing: no REINFORCE terms, and no repeated rows for train.samples.
        self.reinforce = Reinforce.from_config(t.reinforce) if config.model.attention == "hard" else None
        self.word_weights = word_weight_vector(t.word_weights, self.data.vocab).to(device) if t.word_weights else None
        groups = [{"params": list(self.decoder.parameters()), "lr": t.lr}]
        if self.encoder is not None and self.encoder.trainable:
            groups.append({"params": [p for p in self.encoder.parameters() if p.requires_grad],
                           "lr": config.encoder.lr})
        # Adam's fused kernel updates every parameter in one pass (CPU and CUDA; docs/benchmarks.md).
        self.optimizer = torch.optim.Adam(groups, fused=True) if t.optimizer == "adam" else torch.optim.RMSprop(groups)
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer, mode="max", factor=t.lr_decay,
                                                                    patience=t.lr_patience)
        self.precision = precision_for(device, amp=t.amp)
        self.scaler = self.precision.scaler()
        self.progress = Progress()
        if checkpoint is not None:
            self._restore(checkpoint)
        elif context.rank:  # other processes: other dropout masks, still a function of the seed
            torch.manual_seed(t.seed + 1000 * context.rank)

        module: nn.Module = TrainingModel(decoder=self.decoder, encoder=self.encoder)
        if context.enabled:
            module = nn.parallel.DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None)
        self.module = torch.compile(module) if t.compile else module

        self.writer = None
        if context.is_main:
            # After a kill, events past the checkpoint's step are written again: purge the old ones.
            self.writer = SummaryWriter(str(self.out / "tensorboard"),
                                        purge_step=self.progress.step + 1 if checkpoint else None)
            self._trim_log(self.progress.step if checkpoint else 0)
        # A resumed run's clock goes on from its checkpoint's, so that history and fit() report the
        # time trained in all, not the time since the last resume.
        self.started = time.time() - self.progress.seconds

    # checkpoints

    def payload(self) -> dict[str, Any]:
        self.progress.seconds = time.time() - self.started
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        payload = {
            "config": self.config.to_dict(), "vocab": self.data.vocab.words, "grid": list(self.grid),
            "annotation_dim": self.annotation_dim, "decoder": self.captioner.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(), "progress": vars(self.progress).copy(), "rng": rng,
            "reinforce": self.reinforce.state_dict() if self.reinforce else {},  # hard attention's baseline
        }
        if self.average is not None:  # "decoder" is the average; resuming needs the trained weights too
            payload["training_decoder"] = self.decoder.state_dict()
        if self.encoder is not None and self.encoder.trainable:
            payload["encoder"] = self.encoder.state_dict()
        return payload

    @property
    def captioner(self) -> nn.Module:
        """The decoder that is validated and saved as "decoder": the weights' average under train.ema_decay."""
        return self.decoder if self.average is None else self.average.module

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        self.decoder.load_state_dict(checkpoint.get("training_decoder", checkpoint["decoder"]))
        if self.average is not None and "training_decoder" in checkpoint:  # go on from the saved average
            self.average.module.load_state_dict(checkpoint["decoder"])
            self.average.n_averaged.fill_(1)  # not 0, which would restart it from the trained weights
        if "encoder" in checkpoint and self.encoder is not None:
            self.encoder.load_state_dict(checkpoint["encoder"])
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
            if "cuda" in checkpoint["rng"] and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(checkpoint["rng"]["cuda"])
        else:
            torch.manual_seed(self.config.train.seed + 1000 * self.context.rank + self.progress.step)

    def save(self, *, best: bool = False) -> None:
        if self.context.is_main:
            payload = self.payload()
            save_checkpoint(self.out / "last.pt", payload)
            if best:
                save_checkpoint(self.out / "best.pt", payload)

    # logs

    def _trim_log(self, step: int) -> None:
        """log.jsonl keeps only what happened up to `step` (a resumed run writes the rest again)."""
        path = self.out / "log.jsonl"
        lines = path.read_text().splitlines() if path.exists() and step else []
        path.write_text("".join(f"{line}\n" for line in lines if json.loads(line)["step"] <= step))

    def log(self, entry: dict[str, Any]) -> None:
        with (self.out / "log.jsonl").open("a") as file:
            file.write(json.dumps(entry) + "\n")

    def log_losses(self, losses: dict[str, float]) -> None:
        if self.writer is None:
            return
        step = self.progress.step
        for name, number in losses.items():
            self.writer.add_scalar(f"train/{name}", number, step)
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.writer.add_scalar("train/lr", lrs[0], step)
        if len(lrs) > 1:
            self.writer.add_scalar("train/lr_encoder", lrs[1], step)
        self.writer.add_scalar("data/skipped_images", self.progress.skipped_images, step)
        self.log({"step": step, "epoch": self.progress.epoch, **losses, "lr": lrs,
                  "skipped_images": self.progress.skipped_images})

    # evaluation

    def evaluate_and_save(self) -> bool:
        """Validate (rank 0), decay the learning rate, keep the best; True when it is time to stop early."""
        t, progress = self.config.train, self.progress
        metrics: dict[str, float] = {}
        value = math.nan
        if self.context.is_main:
            metrics = validate(self.captioner, self.data.val, self.data.vocab, self.config, device=self.device,
                               annotations=self.data.val_annotations)
            value = metrics[t.val_metric]
        value = distributed.broadcast_float(self.context, value, device=self.device)
        self.scheduler.step(value)
        progress.history.append({"step": progress.step, "epoch": progress.epoch, **metrics, t.val_metric: value,
                                 "lr": self.optimizer.param_groups[0]["lr"], "seconds": time.time() - self.started})
        improved = value > progress.best_metric
        if improved:
            progress.best_metric, progress.stale_evaluations = value, 0
        else:
            progress.stale_evaluations += 1
        if self.writer is not None:
            for name, number in metrics.items():
                self.writer.add_scalar(f"val/{name}", number, progress.step)
            log_overlays(self.writer, self.captioner, self.data.val, self.data.val_annotations, self.data.vocab,
                         count=t.log_images, max_length=self.config.decode.max_length, step=progress.step,
                         device=self.device, hard_choice=hard_choice(self.config))
            self.log({"step": progress.step, "epoch": progress.epoch, "validation": metrics})
            shown = ("Bleu_4", "CIDEr", "attention_correctness")
            summary = ", ".join(f"{k} {metrics[k]:.3f}" for k in shown if k in metrics)
            tqdm.write(f"step {progress.step} epoch {progress.epoch}: {summary}{' (best)' if improved else ''}")
        self.save(best=improved)
        return progress.stale_evaluations >= t.early_stop_patience

    # the loop

    def loader(self, batches: list[list[int]]) -> DataLoader:
        t = self.config.train
        # Its own generator: a DataLoader otherwise draws its worker seed from the global RNG each
        # epoch, so a resumed run (one more DataLoader) would get different dropout masks.
        return DataLoader(self.data.pairs, batch_sampler=batches, collate_fn=self.data.collate,
                          num_workers=t.num_workers, pin_memory=t.pin_memory and self.device.type == "cuda",
                          generator=torch.Generator().manual_seed(t.seed))

    def step(self, batch: Batch) -> dict[str, float] | None:
        """One optimizer step on this process's part of a global batch (None: no readable image in it)."""
        t = self.config.train
        for reason in batch.failures:
            tqdm.write(f"warning: skipping an unreadable image: {reason}", file=sys.stderr)
        self.progress.skipped_images += len(batch.failures)
        if batch.tokens.shape[0] == 0:
            return None
        batch = batch.to(self.device, non_blocking=True)
        words = float((batch.tokens[:, 1:] != Vocabulary.pad_id).sum())
        shares = distributed.global_shares(self.context, words, float(batch.tokens.shape[0]), device=self.device)
        losses = train_step(self.module, batch, self.optimizer, grad_clip=t.grad_clip, ds_weight=t.ds_weight,
                            ds_target=t.ds_target, precision=self.precision,
                            scaler=self.scaler if self.scaler.is_enabled() else None, shares=(shares[0], shares[1]),
                            reinforce=self.reinforce, word_weights=self.word_weights, step=self.progress.step)
        if self.average is not None:
            self.average.update_parameters(self.decoder)
        return losses

    def train(self, signals: StopSignals) -> str | None:
        """Epochs until done, early stopping or a signal; returns the signal's name if one stopped it."""
        t, progress = self.config.train, self.progress
        lengths = self.data.pairs.lengths
        stop = early_stopped = False
        while progress.epoch < t.epochs and not stop:
            batches = epoch_batches(lengths, batch_size=t.batch_size, seed=t.seed, epoch=progress.epoch,
                                    bucket=self.config.data.bucket_batches)
            if self.config.data.mirror:
                batches = mirror_batches(batches, pairs=len(lengths), seed=t.seed, epoch=progress.epoch)
            batches = rank_batches(batches, rank=self.context.rank, world_size=self.context.world_size)
            bar = tqdm(self.loader(batches[progress.batch_in_epoch:]), desc=f"epoch {progress.epoch}", unit="batch",
                       initial=progress.batch_in_epoch, total=len(batches), leave=False,
                       disable=None if self.context.is_main else True)
            for batch in bar:
                losses = self.step(batch)
                progress.step += 1
                progress.batch_in_epoch += 1
                if losses is not None:
                    bar.set_postfix(loss=f"{losses['loss']:.3f}")
                    if progress.step % t.log_every_steps == 0:
                        self.log_losses(losses)
                if t.max_steps is not None and progress.step >= t.max_steps:
                    stop = True
                    break
                mid_epoch = progress.batch_in_epoch < len(batches)
                if t.eval_every_steps and progress.step % t.eval_every_steps == 0 and mid_epoch:
                    stop = early_stopped = self.evaluate_and_save()
                    if stop:
                        break
                elif t.save_every_steps and progress.step % t.save_every_steps == 0:
                    self.save()  # a place to resume from after a kill (SIGKILL cannot be caught)
                if signals.received is not None and mid_epoch:  # at an epoch's end: evaluate first
                    self.save()
                    return signal.Signals(signals.received).name
            if progress.batch_in_epoch >= len(batches):
                progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
            if not early_stopped:
                stop = self.evaluate_and_save() or stop
            if signals.received is not None:  # evaluate_and_save wrote last.pt
                return signal.Signals(signals.received).name
        return None

    def close(self) -> None:
        """Close the TensorBoard writer and release the training module, before the process group goes."""
        if self.writer is not None:
            self.writer.close()
        # DDP's reducer holds the gloo process group. Left to the interpreter's exit (the Run sits in
        # reference cycles), it is destroyed after destroy_process_group, and gloo's threads can abort
        # the process: "terminate called without an active exception", SIGABRT. This happened once in
        # CI, and in 4 of 48 runs of a bare two-process reproduction (a barrier before the destroy did
        # not prevent it); none in 27 runs that released the wrapper first.
        self.module = None
        if self.context.enabled:
            gc.collect()


def fit(config: Config, *, resume: bool = False, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Train as configured; returns the best validation metric, the checkpoint paths and the
    seconds trained (in all: a resumed run counts those before its checkpoint too).

    Under torchrun (WORLD_SIZE > 1) every process calls this; they train one model together.
    """
    context, device = distributed.setup(torch.device(device))
    try:
        run = Run(config, resume=resume, context=context, device=device)
        try:
            with StopSignals() as signals:
                interrupted = run.train(signals)
        finally:
            run.close()
    finally:
        distributed.teardown(context)
    out = run.out
    return {"best_metric": run.progress.best_metric, "metric": config.train.val_metric, "steps": run.progress.step,
            "seconds": time.time() - run.started, "best": str(out / "best.pt"), "last": str(out / "last.pt"),
            "interrupted": interrupted, "skipped_images": run.progress.skipped_images}
