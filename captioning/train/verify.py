"""`captioning verify CKPT`: score a checkpoint again as its run's validation scored it, and say whether
its recorded numbers reproduce; when they do not, name what differs from its record (train/provenance.py):
the data (its references and its images' contents included: val images replaced under their own
names are named by their files), the model's settings, the
preprocessing, the validation's settings, the versions, the weights; the hardware only where all of
these match. A released model (shipped.for_captioning) is scored as its card says it was: the
shipped file on the val split with the card's beam, against the card's numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from captioning.checkpoint import CheckpointError, load_checkpoint, load_trained, run_weights
from captioning.config import Config
from captioning.data.records import DatasetError, counted, first_names, name_on_one_line, read_records
from captioning.eval.evaluate import evaluate_trained
from captioning.train.provenance import run_record, settings_as_written
from captioning.train.validation import validation_metrics

TOLERANCE = 1e-4  # the same machine gives the same numbers; another CPU or a GPU moves the last digits
NOT_METRICS = ("step", "epoch", "lr", "seconds")


@dataclass
class Verification:
    step: int
    recorded: dict[str, float]  # the metrics the run's validation gave at the checkpoint's step
    now: dict[str, float]  # the same metrics computed again
    differs: dict[str, list[str]]  # record section -> the entries that differ now ({} when all agree)
    tolerance: float
    contents_recorded: bool = True  # whether the record holds the val images' contents (older ones do not)
    release: dict[str, Any] | None = None  # a released model's note: its card's numbers are what was scored

    @property
    def reproduces(self) -> bool:
        """Every recorded number again: an integer (a count) exactly, a float within the tolerance
        (NaN where it was NaN). verify() refuses a record with no number to compare."""
        return bool(self.recorded) and all(_agrees(value, self.now.get(name, math.nan), self.tolerance)
                                           for name, value in self.recorded.items())


def _agrees(recorded: float, now: float, tolerance: float) -> bool:
    if isinstance(recorded, int):
        return now == recorded
    return math.isclose(now, recorded, rel_tol=0, abs_tol=tolerance) or (math.isnan(recorded) and math.isnan(now))


def verify(path: str | Path, *, overrides: tuple[str, ...] = (), device: str | torch.device = "cpu",
           tolerance: float = TOLERANCE) -> Verification:
    """Validate the checkpoint again on its recorded split, with the settings its validation used."""
    payload = load_checkpoint(path)
    if isinstance(payload.get("release"), dict) and isinstance(payload["release"].get("val"), dict):
        return verify_release(path, payload, overrides=overrides, device=device, tolerance=tolerance)
    if payload.get("members"):
        raise CheckpointError(f"{path}: holds {len(payload['members']) + 1} decoders that caption together and no "
                              "release card to score them against (its record is its first decoder's run): verify "
                              "each one's own checkpoint")
    record = payload.get("record")
    if not isinstance(record, dict):
        raise CheckpointError(f"{path}: carries no record of what made it (written before checkpoints had one)")
    progress = payload.get("progress", {})
    history = progress.get("history") or []
    if not history or history[-1].get("step") != progress.get("step"):
        last = history[-1].get("step") if history else None
        raise CheckpointError(f"{path}: saved at step {progress.get('step')}, after its last validation "
                              f"(step {last}): no numbers of these weights to reproduce; verify best.pt")
    recorded = {name: value for name, value in history[-1].items() if name not in NOT_METRICS}
    not_numbers = [name for name, value in recorded.items()
                   if not isinstance(value, (int, float)) or isinstance(value, bool)]
    if not_numbers:
        raise CheckpointError(f"{path}: its record of the validation at step {progress.get('step')} holds values that "
                              f"are not numbers ({', '.join(not_numbers)}): nothing to compare them with")
    if not recorded:
        raise CheckpointError(f"{path}: its record of the validation at step {progress.get('step')} holds no "
                              "numbers: nothing to compare")
    trained = load_trained(path, overrides=overrides, device=device, payload=payload)
    config = as_validated(trained.config, record.get("validation", {}))
    val, annotations = trained.split("val")  # a fine-tuned encoder's own annotations, as its validation read them
    now = validation_metrics(trained.decoder, val, trained.vocab, config, device=device, annotations=annotations) or {}
    # the val images' contents only: the numbers are the val split's, and hashing the training
    # images (all of COCO's) would tell nothing the weights' digest does not
    current = {**run_record(config, train=read_records(config.data, "train"), val=val.records,
                            vocab=trained.vocab.words, contents={"val": val.contents}),
               "weights": run_weights(payload)}
    _in_recorded_order(current, record, payload)
    digests = current.pop("val_image_digests")
    differs = {section: _differences(record.get(section, {}), values) for section, values in current.items()}
    _name_changed_images(differs, record.get("val_image_digests"), digests)
    return Verification(step=int(progress["step"]), recorded=recorded, now={n: now.get(n, math.nan) for n in recorded},
                        differs={section: names for section, names in differs.items() if names},
                        tolerance=tolerance, contents_recorded="val_image_contents" in record.get("data", {}))


def as_validated(config: Config, recorded: dict[str, Any]) -> Config:
    """The config, decoding as the recorded validation did where the record predates a decoding
    setting: a run validated before `<unk>` could be blocked said it freely, and before the n-gram
    block repeated at will (their records name neither). In place; returns it."""
    if "allow_unk" not in recorded:
        config.decode.allow_unk = True
    if "no_repeat_ngram" not in recorded:
        config.decode.no_repeat_ngram = 0
    return config


def verify_release(path: str | Path, payload: dict[str, Any], *, overrides: tuple[str, ...] = (),
                   device: str | torch.device = "cpu", tolerance: float = TOLERANCE) -> Verification:
    """A released model (shipped.for_captioning): its card's numbers are the shipped file's own,
    scored on the val split with the card's beam; they are scored so again. Its data must be given
    (data.root=DIR: a released model names no place on any machine); without it, one line saying
    what the model is and how to score it."""
    release = payload["release"]
    card = release["val"]
    recorded = {name: value for name, value in card.items() if isinstance(value, float)}
    trained = load_trained(path, overrides=overrides, device=device, payload=payload)
    try:
        evaluation, val = evaluate_trained(trained, split="val", beam_size=int(card.get("beam_size", 3)))
    except DatasetError as error:
        shown = ", ".join(f"{name} {value:.4f}" for name, value in recorded.items())
        raise DatasetError(f"{path}: a released model ({release.get('name', 'unnamed')}), whose card gives on val "
                           f"(beam {card.get('beam_size')}, {card.get('tokenizer')}): {shown}; scoring it again needs "
                           f"its data ({error}): captioning verify {path} data.root=DIR") from error
    config = trained.config
    current = {**run_record(config, train=read_records(config.data, "train"), val=val.records,
                            vocab=trained.vocab.words, contents={"val": val.contents}),
               "weights": run_weights(payload)}
    record = payload.get("record", {})
    _in_recorded_order(current, record, payload)
    digests = current.pop("val_image_digests")
    differs = {section: _differences(record.get(section, {}), values) for section, values in current.items()
               if section in ("data", "model", "preprocessing", "weights")}  # what the card's scoring read
    _name_changed_images(differs, record.get("val_image_digests"), digests)
    # The card's numbers depend on how it decoded (its decode section, recorded since cards had it):
    # an override of decode.* moves them, and says so.
    decoded = {key: getattr(config.decode, key) for key in card.get("decode", {})}
    differs["card"] = _differences({"tokenizer": card.get("tokenizer"), **card.get("decode", {})},
                                   {"tokenizer": evaluation.tokenizer, **decoded})
    now = evaluation.metrics
    return Verification(step=int(payload.get("progress", {}).get("step", 0)), recorded=recorded,
                        now={name: now.get(name, math.nan) for name in recorded},
                        differs={section: names for section, names in differs.items() if names},
                        tolerance=tolerance, contents_recorded="val_image_contents" in record.get("data", {}),
                        release=release)


def _in_recorded_order(current: dict[str, Any], record: dict[str, Any], payload: dict[str, Any]) -> None:
    """A record written before the model's settings were sorted holds their digest in the order its
    config lists them: where that digest is the stored config's, the settings are the recorded ones."""
    if isinstance(record.get("model"), dict) and record["model"].get("settings") == settings_as_written(
            payload.get("config", {})):
        current["model"]["settings"] = record["model"]["settings"]


def _name_changed_images(differs: dict[str, list[str]], recorded: list[list[str]] | None,
                         now: list[list[str]]) -> None:
    """Where the val images' contents differ, the images by their files (relative to data.root), in
    place of the two digests of the whole split; a record written before it kept each image's digest
    (val_image_digests) gives the digests alone. In place."""
    if not isinstance(recorded, list):
        return
    was = {file: value for file, value in recorded}
    changed = [file for file, value in now if file in was and was[file] != value]
    entries = differs.get("data", [])
    for i, entry in enumerate(entries):
        if entry.startswith("val_image_contents ") and changed:
            names = first_names([name_on_one_line(file) for file in changed])
            entries[i] = f"val_image_contents: {counted(len(changed), 'image')} changed ({names})"


def _differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    # What the record holds: a part recorded since (the test split's ids) is no difference.
    return [f"{name} {recorded[name]!r} -> {value!r}" for name, value in now.items()
            if name in recorded and recorded[name] != value]


def report(verification: Verification, path: str | Path) -> list[str]:
    """What `captioning verify` prints."""
    v = verification
    if v.release is not None:
        card = v.release["val"]
        lines = [f"{path}: a released model ({v.release.get('name', 'unnamed')}): its card's numbers on val (beam "
                 f"{card.get('beam_size')}, {card.get('tokenizer')}), scored again"]
    else:
        lines = [f"{path}: its validation at step {v.step}, computed again"]
    lines += [f"  {name:<30} recorded {value:.4f}  now {v.now[name]:.4f}" for name, value in v.recorded.items()]
    if v.reproduces:
        lines.append(f"reproduces: every number within {v.tolerance:g}")
    else:
        lines.append(f"does not reproduce (tolerance {v.tolerance:g})")
    for section, names in v.differs.items():
        lines.append(f"  {section} differs from the record: {'; '.join(names)}")
    if not v.reproduces and not v.differs and v.contents_recorded:
        lines.append("  nothing recorded differs, the val images' contents included: the hardware or the code's "
                     "arithmetic moved the numbers")
    elif not v.reproduces and not v.differs:
        lines.append("  nothing recorded differs, but the record predates digests of the images' contents: val "
                     "images changed under their own names, the hardware or the code's arithmetic moved the numbers")
    return lines
