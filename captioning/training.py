"""Training the decoder on cached annotations: the loop, validation by decoding, checkpoints.

Notation: B batch, T caption steps, L grid cells, D channels.

The encoder is frozen and its annotations cached, so a training step is decoder-only. Model
selection, learning-rate decay and early stopping all use a metric of *decoded* validation
captions (greedy), never a teacher-forced loss: a teacher-forced loss can keep falling while the
captions the model actually produces stop improving.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from captioning.checkpoint import load_checkpoint, save_checkpoint
from captioning.config import Config
from captioning.data.dataset import Batch, CaptionPairs, collate
from captioning.data.splits import Split, load_splits
from captioning.decoder import AttentionDecoder
from captioning.evaluation import evaluate_split
from captioning.losses import cross_entropy, doubly_stochastic
from captioning.model import build_decoder
from captioning.vocab import Vocabulary, tokenize


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the last good checkpoint is kept."""


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint so that a resumed run continues exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of `epoch` already done
    best_metric: float = -math.inf
    stale_evaluations: int = 0  # evaluations since the best one, for early stopping
    history: list[dict[str, float]] = field(default_factory=list)


def train_step(decoder: AttentionDecoder, batch: Batch, optimizer: torch.optim.Optimizer, *, grad_clip: float,
               ds_weight: float, ds_target: str) -> dict[str, float]:
    """One optimizer step of cross-entropy plus the doubly stochastic term."""
    decoder.train()
    inputs, targets = batch.tokens[:, :-1], batch.tokens[:, 1:]  # [B, T-1]: predict word t+1 from word t
    mask = (targets != Vocabulary.pad_id).float()  # [B, T-1], padding reaches neither term
    output = decoder(batch.annotations, inputs, lengths=mask.sum(1).long())  # padded steps are not computed
    xe = cross_entropy(output.logits, targets, mask)
    ds = doubly_stochastic(output.alphas, mask, target=ds_target)
    loss = xe + ds_weight * ds
    if not torch.isfinite(loss):
        raise TrainingError(f"non-finite loss ({loss.item()}); stopping, the last good checkpoint is kept")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(decoder.parameters(), grad_clip)
    optimizer.step()
    return {"loss": loss.item(), "xe": xe.item(), "ds": ds.item(), "grad_norm": norm.item()}


def validate(decoder: AttentionDecoder, split: Split, vocab: Vocabulary, config: Config, *,
             device: str | torch.device) -> dict[str, float]:
    """Greedy captions of (the first val_images of) a split, scored with the Java-free metrics."""
    count = config.train.val_images or len(split.records)
    metrics, _ = evaluate_split(
        decoder, split.annotations[:count], image_ids=split.image_ids[:count], references=split.references[:count],
        vocab=vocab, grid=split.grid, grounding=split.grounding[:count] if split.grounding else None,
        beam_size=1, max_length=config.decode.max_length, full=False, device=device)
    return metrics


def _epoch_batches(size: int, *, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The shuffled batches of one epoch: a pure function of (seed, epoch), so a resumed run can
    skip exactly the batches it already did."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return [b.tolist() for b in torch.randperm(size, generator=generator).split(batch_size)]


def fit(config: Config, *, resume: bool = False, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Train as configured; returns the best validation metric and the checkpoint paths."""
    t = config.train
    out = Path(t.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = load_splits(config, ("train", "val"), device=device)
    train, val = splits["train"], splits["val"]

    checkpoint = load_checkpoint(out / "last.pt") if resume else None
    if checkpoint is not None:
        vocab = Vocabulary(checkpoint["vocab"])
    else:
        captions = [tokenize(c) for r in train.records for c in r.captions]
        vocab = Vocabulary.build(captions, min_count=config.data.min_word_count)
    vocab.save(out / "vocab.json")

    annotation_dim = train.annotations.shape[2]
    torch.manual_seed(t.seed)  # before the decoder is built: its initial weights follow train.seed
    random.seed(t.seed)
    decoder = build_decoder(config, vocab_size=len(vocab), annotation_dim=annotation_dim).to(device)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=t.lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=t.lr_decay,
                                                           patience=t.lr_patience)
    progress = Progress()
    if checkpoint is not None:
        decoder.load_state_dict(checkpoint["decoder"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        progress = Progress(**checkpoint["progress"])
        torch.set_rng_state(checkpoint["rng"]["torch"])
        random.setstate(checkpoint["rng"]["python"])

    def payload() -> dict[str, Any]:
        return {
            "config": config.to_dict(), "vocab": vocab.words, "grid": list(train.grid),
            "annotation_dim": annotation_dim, "decoder": decoder.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "progress": vars(progress).copy(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }

    writer = SummaryWriter(str(out / "tensorboard"))
    dataset = CaptionPairs(train.annotations, train.records, vocab, max_length=config.data.max_caption_length)
    started = time.time()

    def evaluate_and_save() -> bool:
        """Validate, decay the learning rate, keep the best; True when it is time to stop early."""
        metrics = validate(decoder, val, vocab, config, device=device)
        value = metrics[t.val_metric]
        scheduler.step(value)
        for name, number in metrics.items():
            writer.add_scalar(f"val/{name}", number, progress.step)
        progress.history.append({"step": progress.step, "epoch": progress.epoch, **metrics,
                                 "lr": optimizer.param_groups[0]["lr"], "seconds": time.time() - started})
        improved = value > progress.best_metric
        if improved:
            progress.best_metric, progress.stale_evaluations = value, 0
        else:
            progress.stale_evaluations += 1
        save_checkpoint(out / "last.pt", payload())
        if improved:
            save_checkpoint(out / "best.pt", payload())
        shown = ("Bleu_4", "CIDEr", "attention_correctness")
        summary = ", ".join(f"{k} {metrics[k]:.3f}" for k in shown if k in metrics)
        tqdm.write(f"step {progress.step} epoch {progress.epoch}: {summary}{' (best)' if improved else ''}")
        return progress.stale_evaluations >= t.early_stop_patience

    stop = early_stopped = False
    while progress.epoch < t.epochs and not stop:
        batches = _epoch_batches(len(dataset), batch_size=t.batch_size, seed=t.seed, epoch=progress.epoch)
        # Its own generator: a DataLoader otherwise draws its worker seed from the global RNG each
        # epoch, so a resumed run (one more DataLoader) would get different dropout masks.
        loader = DataLoader(dataset, batch_sampler=batches[progress.batch_in_epoch:], collate_fn=collate,
                            num_workers=t.num_workers, generator=torch.Generator().manual_seed(t.seed))
        bar = tqdm(loader, desc=f"epoch {progress.epoch}", unit="batch", initial=progress.batch_in_epoch,
                   total=len(batches), leave=False, disable=None)
        for batch in bar:
            losses = train_step(decoder, batch.to(device), optimizer, grad_clip=t.grad_clip,
                                ds_weight=t.ds_weight, ds_target=t.ds_target)
            progress.step += 1
            progress.batch_in_epoch += 1
            bar.set_postfix(loss=f"{losses['loss']:.3f}")
            if progress.step % 10 == 0:
                for name, number in losses.items():
                    writer.add_scalar(f"train/{name}", number, progress.step)
                writer.add_scalar("train/lr", optimizer.param_groups[0]["lr"], progress.step)
            if t.max_steps is not None and progress.step >= t.max_steps:
                stop = True
                break
            mid_epoch = progress.batch_in_epoch < len(batches)
            if t.eval_every_steps and progress.step % t.eval_every_steps == 0 and mid_epoch:
                stop = early_stopped = evaluate_and_save()
                if stop:
                    break
        if progress.batch_in_epoch >= len(batches):
            progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
        if not early_stopped:
            stop = evaluate_and_save() or stop
    writer.close()
    return {"best_metric": progress.best_metric, "metric": t.val_metric, "steps": progress.step,
            "seconds": time.time() - started, "best": str(out / "best.pt"), "last": str(out / "last.pt")}
