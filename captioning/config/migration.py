"""Settings that moved, changed their meaning or were taken away, and what becomes of them.

Configs and checkpoints written before the sections existed (checkpoint format 1) name some
settings by their old flat keys (RENAMED). A checkpoint's config is migrated on load; a file or an
override that uses an old key is refused with its new name (loading.py). A setting whose meaning
changed took a new name (REDEFINED): a file or an override naming the old one is refused with what
changed, so that no run trains on a number meant in the old units; a checkpoint's config carries
its old value over to the new name, which only describes how it was trained (a resumed run reads
its config file). Settings that were taken away (REMOVED) are refused in a file or an override with
the reason, and dropped from a checkpoint's config, which records every setting of its day.
Settings renamed since format 2 (MOVED: a name that meant two things, a dataset format's settings
given their section) are read from a checkpoint's config under their new name; in a file or an
override the old name is an alias (the README lists them), read with a warning that names the new one.
"""

from __future__ import annotations

import copy
from typing import Any

# The flat keys of checkpoint format 1, and where each setting lives now.
RENAMED = {
    "model.hard_expectation_prob": "model.hard.expectation_prob", "model.hard_coin": "model.hard.coin",
    "model.hard_warmup": "model.hard.warmup",
    "model.local_base": "model.local.base", "model.local_window": "model.local.window",
    "model.local_sigma": "model.local.sigma", "model.cosine_sharpness": "model.cosine.sharpness",
    "model.init": "model.extras.init", "model.glimpses": "model.extras.glimpses",
    "model.query_word": "model.extras.query_word", "model.position": "model.extras.position",
    "model.unit_annotations": "model.extras.unit_annotations", "model.temperature": "model.extras.temperature",
    "train.reinforce_weight": "train.reinforce.weight", "train.entropy_weight": "train.reinforce.entropy_weight",
    "train.baseline": "train.reinforce.baseline", "train.baseline_decay": "train.reinforce.baseline_decay",
    "train.samples": "train.reinforce.samples", "train.reinforce_warmup": "train.reinforce.warmup",
    "decode.hard_attention": "decode.hard_choice",
}

# Settings renamed since checkpoint format 2, old dotted key -> new; the values are untouched.
MOVED = {
    # "warmup" and "samples" each named two settings (model.hard.warmup, train.scst.samples).
    "train.reinforce.warmup": "train.reinforce.weight_warmup",
    "train.reinforce.samples": "train.reinforce.location_samples",
    # A dataset format's own settings live in its section of data.
    "data.captions_file": "data.folder.captions_file", "data.split_seed": "data.folder.split_seed",
    "data.split_share": "data.folder.split_share", "data.allow_outside_images": "data.folder.allow_outside_images",
    "data.train_captions": "data.coco_official.train_captions",
    "data.train_images": "data.coco_official.train_images",
    "data.val_captions": "data.coco_official.val_captions", "data.val_images": "data.coco_official.val_images",
}

# Old name -> (new name, what changed).
REDEFINED = {
    "train.ds_weight": ("train.ds_lambda", "the doubly stochastic term is now weighed against a caption's summed "
                        "word costs, as lambda in Eq. 14 (ds_weight weighed a mean per image against a mean per "
                        "word: ds_lambda = ds_weight x the mean caption length in words, <end> included; the "
                        "authors' COCO scripts use ds_lambda 1)"),
}

# Values that took a new name, setting -> {old value: new value}: a checkpoint's config is read with
# the new one, a file or an override naming the old one is refused with it.
RENAMED_VALUES = {
    "train.scst.baseline": {"mean": "leave_one_out"},  # REINFORCE's name for the same baseline
}

# Settings that no longer exist, and why: a file or override naming one is refused with the reason.
REMOVED = {
    "train.compile": "torch.compile broke its graph at the decoder's .item()/.tolist() and recompiled for "
                     "every new set of caption lengths: minutes of compiling for no speed-up",
    "train.ds_target": "tau = T/L (length) and the paper's tau = 1 (one) move the doubly stochastic term by a "
                       "constant and give the same gradient (captioning/model/paper.py); the paper's tau = 1 is "
                       "what every run computes",
}


def _moved(values: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
    """`values` (a config as plain data) with the setting at each old dotted key of `keys` under its
    new one (a deep copy: the caller's dict is left as it was)."""
    moved = copy.deepcopy(values)
    for old, new in keys.items():
        *path, key = old.split(".")
        body = moved
        for part in path:
            body = body.get(part) if isinstance(body, dict) else None
        if not isinstance(body, dict) or key not in body:
            continue
        value = body.pop(key)
        *path, key = new.split(".")
        target = moved
        for part in path:
            target = target.setdefault(part, {})
        target[key] = value
    return moved


def migrate(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict of checkpoint format 1 with its flat keys moved to their format-2 sections (a
    copy; from_dict then moves what moved since, with_keys_moved)."""
    return _moved(values, RENAMED)


def with_keys_moved(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a checkpoint's config as plain data) with each MOVED setting under its new key (a copy)."""
    return _moved(values, MOVED)


def now_named(dotted: str) -> str:
    """Where the setting an old key named lives now (a format-1 key may have moved twice)."""
    return MOVED.get(RENAMED.get(dotted, dotted), RENAMED.get(dotted, dotted))


def with_values_renamed(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a checkpoint's config as plain data) with each RENAMED_VALUES value under its new
    name (a deep copy: the caller's dict is left as it was)."""
    kept = copy.deepcopy(values)
    for dotted, renamed in RENAMED_VALUES.items():
        *path, key = dotted.split(".")
        body = kept
        for part in path:
            body = body.get(part) if isinstance(body, dict) else None
        if isinstance(body, dict) and isinstance(body.get(key), str) and body[key] in renamed:
            body[key] = renamed[body[key]]
    return kept


def without_removed(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a config as plain data) less the settings in REMOVED (a copy; sections copied as needed)."""
    kept = dict(values)
    for dotted in REMOVED:
        section, key = dotted.split(".")
        if isinstance(kept.get(section), dict) and key in kept[section]:
            kept[section] = {k: v for k, v in kept[section].items() if k != key}
    return kept


def carried_over(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a checkpoint's config as plain data) with each REDEFINED setting under its new name,
    its value as it was (a copy; sections copied as needed)."""
    kept = dict(values)
    for old, (new, _) in REDEFINED.items():
        section, key = old.split(".")
        body = kept.get(section)
        if isinstance(body, dict) and key in body:
            body = {k: v for k, v in body.items() if k != key}
            body.setdefault(new.split(".")[1], values[section][key])
            kept[section] = body
    return kept
