"""What a checkpoint keeps of a run, and a run going on from it exactly.

A checkpoint is state dicts plus plain data (captioning/checkpoint.py writes and reads it): the
config, the vocabulary, the decoder (the weights' average where there is one, beside the trained
weights), a fine-tuned encoder, the optimizer, the schedule, the gradient scaler, the progress, this
process's random states and the objective's own state (hard attention's baseline).

A resumed run goes on training the model its checkpoint holds: this run's config may change how it
trains (train.*) and where things are, not what the model is (LastCheckpoint.read).
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from captioning.checkpoint import HOW_IT_COMPUTES, TRAINED_MODEL, CheckpointError, config_of, load_checkpoint
from captioning.config import Config
from captioning.data.vocab import Vocabulary
from captioning.runtime.distributed import Distributed
from captioning.train.build import RunModel
from captioning.train.objective import StepResult, TrainingError
from captioning.train.validation import validation_protocol
from captioning.train.verify import as_validated
from captioning.train.warm_start import model_differences

# A resumed run shares its checkpoint's trained model (captioning.checkpoint.TRAINED_MODEL, less
# HOW_IT_COMPUTES). Other settings may change on resume, as they always could: the training's own
# (train.epochs, train.max_steps, ...), where the data and weights are, how a cache is computed. A few
# may not, or only at an epoch's end, and a few change what was carried over (carry_over).

# The optimizer's moments are the checkpoint's: another optimizer has other state to take.
OPTIMIZER = ("train.optimizer",)
# What an epoch's batches are made of (the objectives' `batches`): changed in the middle of an epoch,
# the rest of it would be cut from other batches, and pairs skipped or trained twice.
EPOCH_BATCHES = ("train.objective", "train.batch_size", "train.seed", "data.bucket_batches", "data.mirror",
                 "data.max_caption_length")  # the clipped lengths are what batches are bucketed by
# The rates and the schedule: a resume that changes them means them from here on.
RATES = ("train.lr", "encoder.lr")


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

    def count(self, result: StepResult, *, max_bad_steps: int) -> bool:
        """A step's place in the progress: the global batch's unreadable images, and a skipped step
        (train.max_bad_steps of them in a row stop the run). True when the step was applied."""
        self.skipped_images += result.agreement.unreadable
        if result.agreement.empty:  # no process had an image: nothing was stepped, nothing skipped
            return False
        if not result.skipped:
            self.bad_steps_in_a_row = 0
            return True
        self.skipped_steps += 1
        self.bad_steps_in_a_row += 1
        losses = result.losses
        tqdm.write(f"warning: step {self.step + 1}: loss {losses.get('loss', math.nan):.4g}, gradient norm "
                   f"{losses.get('grad_norm', math.nan):.4g}: not finite (here or in another process), step skipped",
                   file=sys.stderr)
        if self.bad_steps_in_a_row >= max_bad_steps:
            raise TrainingError(f"step {self.step + 1}: the loss or its gradient was not finite "
                                f"{self.bad_steps_in_a_row} steps in a row ({self.skipped_steps} skipped in all); "
                                "stopping, the last good checkpoint is kept")
        return False


@dataclass(frozen=True)
class LastCheckpoint:
    """OUT_DIR/last.pt, read to go on from, and which save of it that was. fit reads it before the
    run takes its folder (train/run_folder.py writes there), so that a refused resume writes nothing."""

    path: Path
    payload: dict[str, Any]
    save: tuple[int, int, int] | None  # inode, size, mtime: each save renames a new file in

    @classmethod
    def read(cls, config: Config) -> LastCheckpoint:
        """last.pt, once it is known to hold the model this run describes; one line otherwise, naming
        each setting that differs, the checkpoint's value and this run's. Loaded, the weights of
        another shape would say so in a page of size mismatches; those of the same shapes would
        silently train another model (another dropout, attention or gate) under the run's name."""
        path = Path(config.train.out_dir) / "last.pt"
        save = _save_of(path)  # before the read: a save in between is then seen as one (latest)
        payload = load_checkpoint(path)
        differences = model_differences(config, payload, path, settings=TRAINED_MODEL, leaving_out=HOW_IT_COMPUTES)
        if differences:
            raise CheckpointError(f"{path}: --resume goes on with the model this run trained, and this run's model "
                                  f"settings differ from it ({'; '.join(differences)}); resume with the checkpoint's, "
                                  "or train another model in another train.out_dir (train.init_from starts from "
                                  "these weights where their shapes fit)")
        optimizer = model_differences(config, payload, path, settings=OPTIMIZER)
        if optimizer:
            raise CheckpointError(f"{path}: --resume goes on with the optimizer state this run saved, and this run's "
                                  f"optimizer differs ({optimizer[0]}); resume with the checkpoint's, or start "
                                  "another run from these weights with train.init_from")
        progress = payload.get("progress", {})
        batches = model_differences(config, payload, path, settings=EPOCH_BATCHES)
        if batches and progress.get("batch_in_epoch", 0):
            epoch = progress.get("epoch", 0) + 1
            raise CheckpointError(f"{path}: stopped in the middle of epoch {epoch}, whose batches this run would make "
                                  f"otherwise ({'; '.join(batches)}), skipping pairs or training some twice; finish "
                                  f"the epoch with the checkpoint's settings and train.epochs={epoch}, then resume "
                                  "with these")
        return cls(path=path, payload=payload, save=save)

    def latest(self, config: Config) -> dict[str, Any]:
        """The checkpoint to go on from, once the run holds its folder: the one read, or last.pt read
        again where a save replaced it since (a run that was ending as this one started)."""
        return self.payload if _save_of(self.path) == self.save else LastCheckpoint.read(config).payload


@dataclass(frozen=True)
class CarriedOver:
    """What carry_over changed: its lines to say, and whether the best is to be measured anew."""

    said: list[str]
    measure_anew: bool


def carry_over(config: Config, checkpoint: dict[str, Any], *, optimizer: torch.optim.Optimizer, scheduler: Any,
               progress: Progress, path: str | Path = "last.pt") -> CarriedOver:
    """What a resume changes of how the run trains, applied after restore_run, a line each to say.
    The optimizer and the schedule come back as they were saved; this run's config is what it trains
    with from here on: a changed train.lr or encoder.lr is the rate now (the decays so far were of
    the old one); train.lr_decay and lr_patience are the schedule's; and another validation
    (validation_protocol) measures the best anew: the run validates the checkpoint's model first
    where its last validation was at the checkpoint's step (Run.fit), and that one replaces best.pt."""
    said = []
    for group, key in zip(optimizer.param_groups, RATES, strict=False):  # the decoder's, the encoder's
        changed = model_differences(config, checkpoint, path, settings=(key,))
        if changed:
            was, group["lr"] = group["lr"], config.train.lr if key == "train.lr" else config.encoder.lr
            said.append(f"{changed[0]}: the rate from here on, in place of {was:g}")
    scheduler.factor, scheduler.patience = config.train.lr_decay, config.train.lr_patience
    # What the best so far was measured with (validation_protocol; as recorded, for a run validated
    # before a decoding setting existed): under another metric or decoding it is a number of another
    # scale, and compared with it, best.pt would stay or move at random.
    validated = config_of(checkpoint, path)
    recorded = (checkpoint.get("record") or {}).get("validation")
    before = validation_protocol(as_validated(validated, recorded) if recorded is not None else validated)
    now = validation_protocol(config)
    validation = [f"{key}: {before[key]!r} -> {value!r}" for key, value in now.items() if before[key] != value]
    if validation:
        progress.best_metric, progress.stale_evaluations = -math.inf, 0
        scheduler.best, scheduler.num_bad_epochs = scheduler.mode_worse, 0
        said.append(f"validation {'; '.join(validation)}: the best so far was measured otherwise, so it is measured "
                    "anew and the next validation replaces best.pt")
    return CarriedOver(said=[f"resume: {line}" for line in said], measure_anew=bool(validation))


def _save_of(path: Path) -> tuple[int, int, int] | None:
    try:
        status = path.stat()
    except FileNotFoundError:  # load_checkpoint says so, in one line
        return None
    return status.st_ino, status.st_size, status.st_mtime_ns


def run_payload(*, config: Config, vocab: Vocabulary, model: RunModel, optimizer: torch.optim.Optimizer, scheduler: Any,
                scaler: torch.amp.GradScaler, progress: Progress, objective_state: dict[str, Any],
                device: torch.device) -> dict[str, Any]:
    """A checkpoint's contents (captioning.checkpoint.save_checkpoint adds the format version)."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":  # this process's GPU only: a run may resume on fewer or more GPUs
        rng["cuda"] = torch.cuda.get_rng_state(device)
    payload = {
        "config": config.to_dict(), "vocab": vocab.words, "grid": list(model.grid),
        "annotation_dim": model.annotation_dim, "decoder": model.validated.state_dict(),
        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "progress": vars(progress).copy(), "rng": rng,
        "reinforce": objective_state,  # hard attention's baseline (train/paper_objective.py)
    }
    if model.average is not None:  # "decoder" is the average; resuming needs the trained weights too
        payload["training_decoder"] = model.decoder.state_dict()
    if model.encoder is not None and model.encoder.trainable:
        payload["encoder"] = model.encoder.state_dict()
    return payload


def restore_run(checkpoint: dict[str, Any], *, model: RunModel, optimizer: torch.optim.Optimizer, scheduler: Any,
                scaler: torch.amp.GradScaler, context: Distributed, device: torch.device, seed: int,
                path: str | Path = "last.pt") -> Progress:
    """Go on exactly where the checkpoint stopped: weights, optimizer, schedule, scaler, RNG; returns
    the progress. The objective's own state is its own to restore (Objective.load_state_dict). The
    model's settings were checked as the checkpoint was read (LastCheckpoint.read); weights that
    still do not fit (a file edited by hand) are one line naming `path`."""
    try:
        model.decoder.load_state_dict(checkpoint.get("training_decoder", checkpoint["decoder"]))
        if model.average is not None and "training_decoder" in checkpoint:
            model.average.load_state_dict(checkpoint["decoder"])
        if "encoder" in checkpoint and model.encoder is not None:
            model.encoder.load_state_dict(checkpoint["encoder"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        if checkpoint.get("scaler"):
            scaler.load_state_dict(checkpoint["scaler"])
    except (KeyError, RuntimeError, ValueError) as error:  # torch's size mismatches and parameter groups alike
        # torch's first line says only where ("Error(s) in loading state_dict for AttentionDecoder:"): the next, what
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [error.__class__.__name__]
        first = lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]
        raise CheckpointError(f"{path}: its weights or optimizer state do not fit the model and optimizer its "
                              f"config describes ({first}); it cannot be resumed") from error
    progress = Progress(**checkpoint["progress"])
    if context.rank == 0:  # rank 0's stream; the others start theirs anew (docs/coco.md)
        torch.set_rng_state(checkpoint["rng"]["torch"])
        random.setstate(checkpoint["rng"]["python"])
        cuda = checkpoint["rng"].get("cuda")
        if isinstance(cuda, list):  # written by older versions: every GPU's state; the first was rank 0's
            cuda = cuda[0] if cuda else None
        if cuda is not None and device.type == "cuda":
            torch.cuda.set_rng_state(cuda, device)
    else:
        torch.manual_seed(seed + 1000 * context.rank + progress.step)
    return progress
