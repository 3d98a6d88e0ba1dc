"""What a checkpoint holds, as the lines `captioning inspect` prints: the run it comes from, where
training stood, the decoders of an ensemble and their encoders, a release's note, every tensor.
Reads only the plain data captioning.checkpoint.load_checkpoint returns (nothing executed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from captioning.checkpoint import config_of
from captioning.runtime.files import SCALE


def describe(payload: dict[str, Any], path: str | Path) -> list[str]:
    """What a checkpoint holds, as lines: the run it comes from, where training stood, every tensor.
    Reads only the plain data load_checkpoint returns (weights_only loading, nothing executed)."""
    config = config_of(payload, path)
    progress = payload.get("progress", {})
    m, e = config.model, config.encoder
    written = (f"format {payload['migrated_from']} (read as format {payload['format_version']}: its settings and "
               "weights under today's names)" if "migrated_from" in payload else f"format {payload['format_version']}")
    lines = [f"{path}: captioning checkpoint, {written}",
             f"  data        {config.data.dataset} at {config.data.image_size}px, grid {payload['grid'][0]}x"
             f"{payload['grid'][1]}, vocabulary of {len(payload['vocab'])} words",
             f"  encoder     {e.name} {e.layer}{f', fine-tuned from {e.fine_tune_from}' if e.fine_tune_from else ''}",
             f"  model       {m.attention} attention, {m.score} score, embed {m.embed_dim}, hidden {m.hidden_dim}, "
             f"attention {m.attention_dim}",
             f"  training    {config.train.objective}, step {progress.get('step', '?')}, "
             f"epoch {progress.get('epoch', '?')}, "
             f"best {config.train.val_metric} {progress.get('best_metric', float('nan')):.4f}"
             + (f", {progress['seconds'] / 3600:.2f} h trained" if "seconds" in progress else
                ", its training time not recorded")]
    lines += _member_lines(payload)
    record = payload.get("record")  # what made it (train/provenance.py); older checkpoints have none
    if isinstance(record, dict):
        for section, values in record.items():
            if isinstance(values, dict):
                lines.append(f"  record {section:<13} " + ", ".join(f"{k} {v}" for k, v in values.items()))
    else:
        lines.append("  record      none (written before checkpoints recorded what made them)")
    release = payload.get("release")  # a shipped model's note (for_captioning): its data, numbers, licence
    if isinstance(release, dict):
        lines += release_lines(release)
    for part in ("decoder", "training_decoder", "encoder"):
        state = payload.get(part)
        if not isinstance(state, dict):
            continue
        tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
        scales = [k for k in tensors if k.endswith(SCALE)]  # int8 storage's: not weights of the model
        count = sum(v.numel() for k, v in tensors.items() if not k.endswith(SCALE))
        stored = f" (int8 codes for {len(scales)} of them, with their scales)" if scales else ""
        lines.append(f"  {part}: {len(tensors) - len(scales)} tensors, {count:,} numbers{stored}")
        lines += [f"    {name:<44} {str(tuple(value.shape)):<18} {str(value.dtype).removeprefix('torch.')}"
                  for name, value in tensors.items()]
    resumable = [k for k in ("optimizer", "scheduler", "rng") if k in payload]
    held = ", ".join(resumable) or "no optimizer state"
    lines.append(f"  resumable   {'yes' if len(resumable) == 3 else 'no'} ({held})")
    return lines


def _member_lines(payload: dict[str, Any]) -> list[str]:
    """A file that holds an ensemble: that it does, and where each other decoder's run stood."""
    members = payload.get("members") if isinstance(payload.get("members"), list) else []
    if not members:
        return []
    lines = [f"  ensemble    {len(members) + 1} decoders caption together (the mean of their word probabilities): "
             "the one above and the members below, each with its own run's record"]
    for index, member in enumerate(members, start=2):
        member = member if isinstance(member, dict) else {}
        progress, train = member.get("progress", {}), member.get("config", {}).get("train", {})
        weights = member.get("record", {}).get("weights", {})
        hours = f", {progress['seconds'] / 3600:.2f} h trained" if "seconds" in progress else ""
        lines.append(f"  member {index}    {train.get('objective', '?')}, seed {train.get('seed', '?')}, step "
                     f"{progress.get('step', '?')}, epoch "
                     f"{progress.get('epoch', '?')}, best {train.get('val_metric', '?')} "
                     f"{progress.get('best_metric', float('nan')):.4f}{hours}, decoder {weights.get('decoder', '?')}"
                     + _tuned_encoder(member, weights))
    return lines


def _tuned_encoder(member: dict[str, Any], weights: dict[str, Any]) -> str:
    """A member's fine-tuned encoder, as inspect names it: the stage it was fine-tuned from, its digest."""
    if not isinstance(member.get("encoder"), dict):
        return ""
    first = member.get("config", {}).get("encoder", {}).get("fine_tune_from")
    return f", encoder fine-tuned from {first} (its weights {weights.get('encoder', '?')})"


def release_lines(release: dict[str, Any]) -> list[str]:
    """What a released model's note says, a line each: that it is one, its card's numbers (the
    shipped file's own), the command that scores it again, where it came from, its licence."""
    lines = [f"  released    {release.get('name', 'a model')}: a released model, cut for captioning (its card's "
             "numbers are this file's own; `captioning verify` scores them again)"]
    for key, value in release.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())
        lines.append(f"  release {key:<12} {value}")
    return lines
