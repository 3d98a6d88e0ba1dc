"""What made a checkpoint, written into it: the data, the preprocessing, how its validation decoded
and scored, the versions that move the numbers, and a digest of its decoder's weights. `captioning
inspect` shows it and `captioning verify` checks a checkpoint's validation numbers against it
(train/verify.py).

Scores that cannot be reproduced are what users of captioning code bases ask about most: a released
checkpoint that scores 124 instead of 130 CIDEr, with no way to tell whether the data, the weights
or a library moved. Each part here is one a reproduction can differ in, and `verify` names the
parts that differ.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from captioning.config import Config
from captioning.config.schema import as_dict
from captioning.data.images import contents_of, split_digest
from captioning.data.records import DatasetError, ImageRecord, read_records
from captioning.model.encoder import normalization, weights_identity
from captioning.train.validation import validation_beam, validation_tokenizer


def digest(value: Any) -> str:
    """16 hex digits of the SHA-256 of a value's JSON."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str | None]:
    """The versions that move a checkpoint's numbers: the libraries, Java (the PTB tokenizer and
    METEOR) and this project's own commit when it runs from a git checkout (None where unknown)."""
    found: dict[str, str | None] = {}
    for package in ("torch", "torchvision", "pycocoevalcap", "nltk"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    found["java"] = _command(["java", "-version"])
    found["captioning"] = project_commit()
    return found


PACKAGE = Path(__file__).resolve().parents[1]  # captioning/, in a checkout or in site-packages


def project_commit(package: Path = PACKAGE) -> str | None:
    """This project's commit where it runs from a git checkout, "-dirty" with uncommitted changes
    (None where unknown): what a record keeps as versions()["captioning"], asked anew each call.
    Only a repository whose root holds the package is this project's checkout: installed into a
    virtual environment inside another repository, the package would name that one's commit."""
    root = package.parent
    top = _command(["git", "-C", str(root), "rev-parse", "--show-toplevel"])
    if top is None or Path(top).resolve() != root.resolve():
        return None
    return _command(["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=40"])


def _command(argv: list[str]) -> str | None:
    """The first line a command prints (stdout, else stderr), or None if it cannot run."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if done.returncode == 0 and lines else None


def test_records(config: Config) -> list[ImageRecord] | None:
    """The test split's images (a run never reads them), None where the data has no test split: with
    a split the seed made (data.dataset=folder), the record is what shows which it was."""
    try:
        return read_records(config.data, "test")
    except DatasetError:
        return None


def image_files(records: Sequence[ImageRecord], root: str | Path) -> list[str]:
    """Each image's file relative to data.root: what a split's digest is keyed by besides its ids
    (a folder's ids are row positions, the same for a.jpg, b.jpg as for holiday1.jpg, holiday2.jpg)."""
    return [Path(os.path.relpath(record.path, root)).as_posix() for record in records]


# Settings that choose how the model is computed, not what: left out of the settings' digest (the
# fused path and `_advance` give the same numbers, tests/model/test_fused.py).
HOW_NOT_WHAT = ("fused",)


def model_settings(config: Config) -> dict[str, Any]:
    """The model's settings, but how it is computed, each section's keys sorted: a plugin's section
    sits where its registration put it, and the digest must not move with that order."""
    def sorted_keys(values: dict[str, Any]) -> dict[str, Any]:
        return {key: sorted_keys(value) if isinstance(value, dict) else value for key, value in sorted(values.items())}

    return sorted_keys({name: value for name, value in as_dict(config.model).items() if name not in HOW_NOT_WHAT})


def settings_as_written(config: dict[str, Any]) -> str:
    """The digest of a checkpoint's model settings as a record written before they were sorted
    (model_settings) took it: in the order its stored config lists them."""
    return digest({name: value for name, value in config.get("model", {}).items() if name not in HOW_NOT_WHAT})


def validation_record(config: Config, *, images: int) -> dict[str, Any]:
    """How validation decoded and scored (captioning.train.validation); greedy on the project's
    tokenizer by default, as every run validated before train.val_beam_size and val_tokenizer."""
    beam, d = validation_beam(config), config.decode
    return {"decoding": "greedy" if beam == 1 else f"beam {beam}", "max_length": d.max_length,
            "length_penalty": d.length_penalty if beam > 1 else 0.0, "no_repeat_ngram": d.no_repeat_ngram,
            "allow_unk": d.allow_unk, "images": images, "tokenizer": validation_tokenizer(config)}


def run_record(config: Config, *, train: Sequence[ImageRecord], val: Sequence[ImageRecord],
               vocab: list[str], contents: dict[str, Sequence[str | None] | None] | None = None) -> dict[str, Any]:
    """The record of a run's checkpoints (the same for every checkpoint of the run): besides the
    image lists (ids and files), the digest of each split's image contents (an image replaced under
    its own name changes no id and no file name), the val references validation scored against, and
    the model's settings (an edited reference or a changed `model.extras.temperature` moves the
    numbers, and verify must say which); and, beside the sections, each val image's file and digest
    (val_image_digests, a list, which `inspect` leaves out): what lets verify name the images changed.
    `contents`: split -> each image's digest where the feature cache holds them (None: hashed here);
    a split it leaves out is not digested (verify needs val's alone); the test split's images, which a
    run never reads otherwise, are hashed here."""
    e, d = config.encoder, config.data
    mean, std = normalization(e.name)
    tests = test_records(config)
    ids = {name: None if records is None else [r.image_id for r in records]
           for name, records in (("train", train), ("val", val), ("test", tests))}
    images = {"train": train, "val": val, "test": tests}
    hashed = {split: contents_of([r.path for r in images[split]], known)
              for split, known in (contents or {}).items() if images.get(split) is not None}
    digested = {f"{split}_image_contents": split_digest(values) for split, values in hashed.items()}
    record: dict[str, Any] = {
        "data": {"dataset": d.dataset, "language": d.language,
                 "train_images": len(train), "train_image_ids": digest(ids["train"]),
                 "train_image_files": digest(image_files(train, d.root)),
                 "val_images": len(val), "val_image_ids": digest(ids["val"]),
                 "val_image_files": digest(image_files(val, d.root)),
                 "test_images": None if tests is None else len(tests),
                 "test_image_ids": None if tests is None else digest(ids["test"]),
                 "test_image_files": None if tests is None else digest(image_files(tests, d.root)),
                 **digested, "vocabulary": digest(vocab),
                 "val_references": digest([list(record.captions) for record in val])},
        "model": {"settings": digest(model_settings(config))},
        "preprocessing": {"image_size": d.image_size, "encoder": e.name, "layer": e.layer, "padding": e.padding,
                          "mean": list(mean), "std": list(std),
                          "weights": weights_identity(e.name, e.weights_path)},
        "validation": validation_record(config, images=min(config.train.val_images or len(val), len(val))),
        "versions": versions(),
    }
    if "val" in hashed:
        record["val_image_digests"] = [[file, value] for file, value in zip(image_files(val, d.root), hashed["val"])]
    return record


def run_record_of(config: Config, data: Any) -> dict[str, Any]:
    """run_record of a run's data (captioning.data.run_data.RunData): its splits, their contents, the vocabulary."""
    return run_record(config, train=data.train.records, val=data.val.records, vocab=data.vocab.words,
                      contents={"train": data.train.contents, "val": data.val.contents, "test": None})
