"""Experiment configuration: nested dataclasses by section, loaded from YAML plus `key.sub=value` overrides.

A YAML file may name one `base:` file (relative to itself) whose values it overrides; bases do not
chain further, so any config can be read in two files at most. Unknown keys are errors, never
silently ignored: a misspelt key that did nothing has cost people whole training runs.

Every value is checked when the config is loaded (`validate`), before any data, feature or model
work: its type, its range, a choice among those that exist, and combinations no run can use. The
paper's model is `model:` itself; hard attention's own settings are `model.hard`, REINFORCE's are
`train.reinforce`, and the options that are not in the paper are `model.extras` (captioning/model/extras).

Configs and checkpoints written before the sections existed (checkpoint format 1) name some
settings by their old flat keys (RENAMED). A checkpoint's config is migrated on load; a file or an
override that uses an old key is refused with its new name. Settings that were taken away (REMOVED)
are refused in a file or an override with the reason, and dropped from a checkpoint's config, which
records every setting of its day.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class DataConfig:
    # shapes | coco | flickr8k | flickr30k | karpathy (any Karpathy-format split file): read from
    # `split_file`; coco_official: the official captions_*2014.json files through pycocotools.
    dataset: str = "shapes"
    root: str = "data/shapes"  # every relative path below is relative to this folder
    split_file: str = "dataset_shapes.json"  # Karpathy-format: dataset_coco.json, dataset_flickr8k.json ...
    image_dir: str = ""  # images are image_dir/filepath/filename (Flickr entries have no filepath)
    train_captions: str = "annotations/captions_train2014.json"  # coco_official only
    train_images: str = "train2014"
    val_captions: str = "annotations/captions_val2014.json"  # coco_official: serves as val and test
    val_images: str = "val2014"
    image_size: int = 224  # the encoder's square input; the shorter side is resized, then centre-cropped
    min_word_count: int = 1
    max_caption_length: int = 20  # clips training targets only, never references
    feature_cache: bool = True  # frozen encoder: train on cached annotations; False runs it on the fly
    bucket_batches: bool = True  # batches of captions of similar length (less padding per step)
    # Training images only, with the encoder on the fly: a random square crop of 80-100% of the
    # shorter side and colour jitter (data/images.py). Never a plain horizontal flip: it would make
    # "to the left of" in the caption false (data.mirror flips the image and swaps the words).
    augment: bool = False
    # Training pairs only (not in the paper): on a coin per pair and epoch, the image mirrored
    # left-right and "left" and "right" swapped in its caption (data/mirror.py).
    mirror: bool = False
    # The first N images of each split whose files are on disk (None: all): a quick look at a
    # partial download, and what `train.py --dry-run` uses.
    max_images: int | None = None
    # The share of a split's images that may be unreadable (left out, and named) before the run stops.
    max_bad_images: float = 0.01


@dataclass
class EncoderConfig:
    name: str = "efficientnet_lite0"  # or resnet101, resnet152, vgg19 (resnet18/34/50 for small tests)
    layer: str = "stride16"  # stride16 (14x14 at 224²; vgg19: conv5_4) or stride32 (7x7 at 224², 14x14 at 448²)
    weights_path: str | None = None  # a local state dict, for machines that cannot download
    batch_size: int = 32  # when computing the feature cache
    padding: str = "zeros"  # how convolutions pad the border: zeros (as trained), reflect, replicate
    fine_tune_from: str | None = None  # e.g. layer4: train this stage and the later ones (no feature cache)
    lr: float = 1e-4  # the learning rate of the fine-tuned part


@dataclass
class HardConfig:
    """Hard attention's own settings (Sec. 4.1); model.attention=hard reads them."""

    expectation_prob: float = 0.5  # an image uses the soft expectation instead of samples (the paper: 0.5)
    coin: str = "image"  # one coin per image, or per "batch" (as the authors' code)
    warmup: int = 0  # steps over which that chance falls from 1 to expectation_prob (not in the paper)


@dataclass
class LocalConfig:
    """The local score's window (model.score=local)."""

    base: str = "additive"  # the content score under the window
    window: str = "gaussian"  # Luong's; "learned" adds a learned shape (model/extras/window.py)
    sigma: float | None = None  # the window's width in grid cells (None: a quarter of the grid's longer side)


@dataclass
class CosineConfig:
    """The cosine score's (and the local score's cosine base's) sharpness."""

    sharpness: float | None = None  # beta at the start, then learned (None: 5)


@dataclass
class ExtrasConfig:
    """Options that are not in the paper (captioning/model/extras), all off by default."""

    init: str = "mean"  # h_0, c_0 from the mean annotation (the paper) or also the "layout" (extras/layout.py)
    glimpses: int = 1  # 2: a second soft glimpse per word (extras/glimpses.py)
    query_word: bool = False  # attention queried with [h_{t-1}; E y_{t-1}] (extras/query_word.py)
    position: str = "none"  # "learned" or "coordinates": 2-D position in the annotations (extras/position.py)
    unit_annotations: bool = False  # annotations rescaled to norm sqrt(D) (extras/unit_annotations.py)
    temperature: float = 1.0  # alpha = softmax(e / temperature)


@dataclass
class ModelConfig:
    embed_dim: int = 128
    hidden_dim: int = 256
    attention_dim: int = 128
    dropout: float = 0.3
    attention: str = "soft"  # how the weights are used: soft (Sec. 4.2) or hard (Sec. 4.1)
    score: str = "additive"  # the attention score function (captioning.model.scores.SCORES)
    gate: str = "scalar"  # the paper's scalar beta; "vector" is the per-channel gate some ports use
    # Eq. 7: "linear" as printed, L_o(E y + L_h h + L_z z); "tanh" as the authors' code, L_o(tanh(...)).
    deep_output: str = "linear"
    hard: HardConfig = field(default_factory=HardConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    cosine: CosineConfig = field(default_factory=CosineConfig)
    extras: ExtrasConfig = field(default_factory=ExtrasConfig)


@dataclass
class ReinforceConfig:
    """Hard attention's REINFORCE terms (Sec. 4.1); soft attention samples nothing and ignores them."""

    weight: float = 1.0  # lambda_r
    entropy_weight: float = 0.0  # lambda_e
    baseline: str = "moving_average"  # the paper's; none; leave_one_out (needs samples >= 2)
    baseline_decay: float = 0.9  # b <- decay b + (1 - decay) log p(y|s,a)
    samples: int = 1  # samples of locations per caption (its rows are repeated)
    warmup: int = 0  # steps over which both terms grow from 0 to their weight (not in the paper)


@dataclass
class ScstConfig:
    """Self-critical sequence training (Rennie et al., 2017), train.objective: scst (train/scst.py)."""

    samples: int = 5  # captions sampled per image
    # What a sample's CIDEr-D is compared with: the greedy caption's (Rennie et al.) or the mean of
    # the image's other samples (Luo, 2020, "a better variant of SCST"; needs samples >= 2).
    baseline: str = "greedy"


@dataclass
class TrainConfig:
    out_dir: str = "runs/shapes_soft"
    # Start from this checkpoint's weights and vocabulary, with a fresh optimizer, schedule and step
    # count (train/warm_start.py); --resume continues a run instead, and then this is ignored.
    init_from: str | None = None
    seed: int = 0
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: str = "adam"  # adam | rmsprop (the paper: RMSProp on Flickr8k, Adam on Flickr30k and COCO)
    grad_clip: float = 5.0
    # A step whose loss or gradient is not finite is skipped; this many in a row stop the run.
    max_bad_steps: int = 20
    # Doubly stochastic regularization (Eq. 14). "one" is the paper's target of 1 per cell;
    # "length" is T/L, which a caption of T words over L cells can actually meet.
    ds_weight: float = 0.0
    ds_target: str = "one"
    val_metric: str = "CIDEr"  # from greedy decoding of the validation split
    lr_decay: float = 0.5  # multiply the learning rate by this when the metric stalls...
    lr_patience: int = 1  # ...for this many evaluations
    early_stop_patience: int = 3
    max_steps: int | None = None  # stop after this many optimizer steps (tests, quick looks)
    eval_every_steps: int | None = None  # also evaluate mid-epoch every this many steps
    val_images: int | None = None  # decode only the first N validation images when evaluating
    num_workers: int = 0
    pin_memory: bool = True  # only used when training on a GPU
    tf32: bool = True  # TF32 matmuls and convolutions in fp32 on GPUs that have them (Ampere and later)
    # Under torchrun: how long (seconds) a process may wait for the others in one collective before
    # the run stops, naming what each process was doing (train/distributed.py).
    dist_timeout: float = 3600.0
    save_every_steps: int | None = None  # also write last.pt every this many steps (resume after a kill)
    log_every_steps: int = 10  # losses to TensorBoard and log.jsonl
    log_images: int = 3  # validation images with per-word overlays in TensorBoard at each evaluation
    amp: bool = False  # autocast: bf16 where supported, else fp16 with a gradient scaler
    # Not in the paper: target words whose cross-entropy counts this many times, e.g. {above: 4}
    # (train/extras/word_weights.py), and an average of the decoder's weights that is validated and
    # kept (train/extras/averaging.py; 0 = off).
    word_weights: dict[str, float] = field(default_factory=dict)
    ema_decay: float = 0.0
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)
    # xe: cross-entropy on the references (the paper); scst: the CIDEr-D of sampled captions, from a
    # trained model (train.init_from), batches of train.batch_size images (train/scst.py).
    objective: str = "xe"
    scst: ScstConfig = field(default_factory=ScstConfig)


@dataclass
class DecodeConfig:
    beam_size: int = 3
    max_length: int = 20
    length_penalty: float = 0.0  # score / length**alpha when ranking finished beams; 0 = raw log-prob
    hard_choice: str = "expectation"  # how hard attention picks its cell: expectation, argmax or sample


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


DATASETS = ("shapes", "coco", "flickr8k", "flickr30k", "karpathy", "coco_official")

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

# Settings that no longer exist, and why: a file or override naming one is refused with the reason.
REMOVED = {
    "train.compile": "torch.compile broke its graph at the decoder's .item()/.tolist() and recompiled for "
                     "every new set of caption lengths: minutes of compiling for no speed-up",
}


def migrate(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict of checkpoint format 1 with its settings moved to where they live now (a copy)."""
    moved = {section: dict(body) if isinstance(body, dict) else body for section, body in values.items()}
    for old, new in RENAMED.items():
        section, key = old.split(".")
        body = moved.get(section)
        if isinstance(body, dict) and key in body:
            value = body.pop(key)
            *path, last = new.split(".")
            target = moved
            for part in path:
                target = target.setdefault(part, {})
            target[last] = value
    return moved


# Checking values -----------------------------------------------------------------------------------


def _check_types(section: Any, where: str, prefix: str) -> None:
    """Every field's value has its annotated type (int is not bool; an int is taken as a float)."""
    hints = typing.get_type_hints(type(section))
    for item in dataclasses.fields(section):
        value, hint, key = getattr(section, item.name), hints[item.name], f"{prefix}.{item.name}"
        if dataclasses.is_dataclass(value):
            _check_types(value, where, key)
            continue
        optional = typing.get_origin(hint) in (types.UnionType, typing.Union)
        if optional:
            if value is None:
                continue
            hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        kind = typing.get_origin(hint) or hint
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(section, item.name, float(value))
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            wanted = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
                      dict: "a mapping"}[kind]
            raise ConfigError(f"{where}: {key} must be {wanted}{' or null' if optional else ''}, got {value!r}")


def _choices(config: Config) -> dict[str, tuple[str, tuple[str, ...]]]:
    from captioning.model.attention import HardAttention
    from captioning.model.encoder import ENCODERS, PADDINGS
    from captioning.model.scores import SCORES
    from captioning.train.losses import BASELINES, DS_TARGETS

    m, t = config.model, config.train
    return {
        "data.dataset": (config.data.dataset, DATASETS), "encoder.name": (config.encoder.name, ENCODERS),
        "encoder.layer": (config.encoder.layer, ("stride16", "stride32")),
        "encoder.padding": (config.encoder.padding, PADDINGS),
        "model.attention": (m.attention, ("soft", "hard")), "model.score": (m.score, tuple(SCORES)),
        "model.gate": (m.gate, ("scalar", "vector")), "model.deep_output": (m.deep_output, ("linear", "tanh")),
        "model.hard.coin": (m.hard.coin, HardAttention.COINS),
        "model.local.base": (m.local.base, tuple(s for s in SCORES if s != "local")),
        "model.local.window": (m.local.window, ("gaussian", "learned")),
        "model.extras.init": (m.extras.init, ("mean", "layout")),
        "model.extras.position": (m.extras.position, ("none", "learned", "coordinates")),
        "train.optimizer": (t.optimizer, ("adam", "rmsprop")), "train.ds_target": (t.ds_target, DS_TARGETS),
        "train.reinforce.baseline": (t.reinforce.baseline, BASELINES),
        "train.objective": (t.objective, ("xe", "scst")), "train.scst.baseline": (t.scst.baseline, ("greedy", "mean")),
        "decode.hard_choice": (config.decode.hard_choice, HardAttention.CHOICES),
    }


def _ranges(config: Config) -> dict[str, tuple[Any, str, bool]]:
    """key -> (value, what it must be, whether it is); None values (optional settings) pass."""
    m, t, d = config.model, config.train, config.decode
    at_least = {"data.image_size": (config.data.image_size, 1), "data.min_word_count": (config.data.min_word_count, 1),
                "data.max_caption_length": (config.data.max_caption_length, 1),
                "data.max_images": (config.data.max_images, 1),
                "encoder.batch_size": (config.encoder.batch_size, 1), "model.embed_dim": (m.embed_dim, 1),
                "model.hidden_dim": (m.hidden_dim, 1), "model.attention_dim": (m.attention_dim, 1),
                "model.hard.warmup": (m.hard.warmup, 0), "train.epochs": (t.epochs, 1),
                "train.batch_size": (t.batch_size, 1), "train.lr_patience": (t.lr_patience, 0),
                "train.early_stop_patience": (t.early_stop_patience, 1), "train.max_steps": (t.max_steps, 1),
                "train.eval_every_steps": (t.eval_every_steps, 1), "train.val_images": (t.val_images, 1),
                "train.num_workers": (t.num_workers, 0), "train.save_every_steps": (t.save_every_steps, 1),
                "train.log_every_steps": (t.log_every_steps, 1), "train.log_images": (t.log_images, 0),
                "train.reinforce.samples": (t.reinforce.samples, 1), "train.max_bad_steps": (t.max_bad_steps, 1),
                "train.scst.samples": (t.scst.samples, 1), "train.reinforce.warmup": (t.reinforce.warmup, 0),
                "decode.beam_size": (d.beam_size, 1), "decode.max_length": (d.max_length, 1)}
    checks = {key: (value, f"at least {low}", value is None or value >= low) for key, (value, low) in at_least.items()}
    positive = {"encoder.lr": config.encoder.lr, "train.lr": t.lr, "train.grad_clip": t.grad_clip,
                "train.dist_timeout": t.dist_timeout,
                "model.extras.temperature": m.extras.temperature, "model.local.sigma": m.local.sigma,
                "model.cosine.sharpness": m.cosine.sharpness}
    checks.update({key: (value, "positive", value is None or value > 0) for key, value in positive.items()})
    unit = {"model.dropout": (m.dropout, 0.0 <= m.dropout < 1.0, "in [0, 1)"),
            "model.hard.expectation_prob": (m.hard.expectation_prob, 0.0 <= m.hard.expectation_prob <= 1.0,
                                            "in [0, 1]"),
            "train.lr_decay": (t.lr_decay, 0.0 < t.lr_decay <= 1.0, "in (0, 1]"),
            "train.ema_decay": (t.ema_decay, 0.0 <= t.ema_decay < 1.0, "in [0, 1)"),
            "train.reinforce.baseline_decay": (t.reinforce.baseline_decay, 0.0 <= t.reinforce.baseline_decay < 1.0,
                                               "in [0, 1)"),
            "model.extras.glimpses": (m.extras.glimpses, m.extras.glimpses in (1, 2), "1 or 2"),
            "data.max_bad_images": (config.data.max_bad_images, 0.0 <= config.data.max_bad_images <= 1.0,
                                    "in [0, 1]")}
    checks.update({key: (value, wanted, ok) for key, (value, ok, wanted) in unit.items()})
    non_negative = {"train.ds_weight": t.ds_weight, "train.reinforce.weight": t.reinforce.weight,
                    "train.reinforce.entropy_weight": t.reinforce.entropy_weight,
                    "decode.length_penalty": d.length_penalty}
    checks.update({key: (value, "at least 0", value >= 0) for key, value in non_negative.items()})
    return checks


def _combinations(config: Config) -> list[str]:
    """Settings that are each fine but that no run can use together."""
    from captioning.data.shapes.grounding import METRICS as SHAPES_METRICS
    from captioning.eval.metrics import VALIDATION_METRICS
    from captioning.model.encoder import stage_names

    m, t, e = config.model, config.train, config.encoder
    problems = []
    metrics = VALIDATION_METRICS + (SHAPES_METRICS if config.data.dataset == "shapes" else ())  # what validation scores
    if t.val_metric not in metrics:
        problems.append(f"train.val_metric '{t.val_metric}' is not a metric that validation produces on "
                        f"data.dataset={config.data.dataset} (it produces {', '.join(metrics)})")
    if t.reinforce.baseline == "leave_one_out" and t.reinforce.samples < 2:
        problems.append("train.reinforce.baseline=leave_one_out needs train.reinforce.samples >= 2 (the other "
                        f"samples of the same caption), got {t.reinforce.samples}")
    if t.objective == "scst":
        problems += _scst_problems(config)
    if m.extras.glimpses == 2 and m.attention != "soft":
        problems.append("model.extras.glimpses=2 needs model.attention=soft (the second glimpse samples nothing, "
                        "so REINFORCE would not train it)")
    if m.score != "local" and m.local != LocalConfig():
        problems.append(f"model.local applies to the local score only, not model.score={m.score}")
    cosine = m.score == "cosine" or (m.score == "local" and m.local.base == "cosine")
    if not cosine and m.cosine != CosineConfig():
        problems.append(f"model.cosine applies to the cosine score (or model.local.base=cosine) only, not "
                        f"model.score={m.score}")
    if m.attention == "soft" and config.decode.hard_choice != "expectation":
        problems.append(f"decode.hard_choice={config.decode.hard_choice} applies to hard attention only; soft "
                        "attention is the expectation")
    if t.ema_decay and e.fine_tune_from is not None:
        problems.append("train.ema_decay averages the decoder only; it does not go with encoder.fine_tune_from")
    if config.data.augment and config.data.feature_cache and e.fine_tune_from is None:
        problems.append("data.augment needs the encoder on the fly (cached annotations are computed once per "
                        "image): set data.feature_cache=false or encoder.fine_tune_from")
    stages = stage_names(e.name, e.layer)
    if e.fine_tune_from is not None and e.fine_tune_from not in stages:
        problems.append(f"encoder.fine_tune_from '{e.fine_tune_from}' is not a stage of {e.name} cut at {e.layer} "
                        f"(stages: {', '.join(stages)})")
    weights = t.word_weights
    if not all(isinstance(word, str) and isinstance(weight, (int, float)) and not isinstance(weight, bool)
               and weight > 0 for word, weight in weights.items()):
        problems.append(f"train.word_weights must map words to positive numbers, got {weights!r}")
    return problems


def _scst_problems(config: Config) -> list[str]:
    t = config.train
    problems = []
    if t.scst.baseline == "mean" and t.scst.samples < 2:
        problems.append(f"train.scst.baseline=mean needs train.scst.samples >= 2 (the image's other samples), "
                        f"got {t.scst.samples}")
    if config.encoder.fine_tune_from is not None or not config.data.feature_cache:
        problems.append("train.objective=scst trains the decoder on cached annotations: not with "
                        "encoder.fine_tune_from or data.feature_cache=false")
    if config.data.mirror or t.word_weights:
        problems.append("train.objective=scst has no reference pairs to mirror or words to weight: "
                        "set data.mirror=false and train.word_weights={}")
    return problems


def validate(config: Config, where: str = "config") -> Config:
    """Values that no run could use, caught before any data is read or model built; returns the config."""
    if not isinstance(config.train.word_weights, dict):
        raise ConfigError(f"{where}: train.word_weights must map words to positive numbers, "
                          f"got {config.train.word_weights!r}")
    for name in ("data", "encoder", "model", "train", "decode"):
        _check_types(getattr(config, name), where, name)
    for key, (value, known) in _choices(config).items():
        if value not in known:
            raise ConfigError(f"{where}: {key} '{value}' is not one of {', '.join(known)}")
    for key, (value, wanted, ok) in _ranges(config).items():
        if not ok:
            raise ConfigError(f"{where}: {key} must be {wanted}, got {value!r}")
    problems = _combinations(config)
    if problems:
        raise ConfigError(f"{where}: {problems[0]}")
    return config


# Reading -------------------------------------------------------------------------------------------


def _merge(target: Any, values: dict[str, Any], where: str, prefix: str = "", source: str | None = None) -> None:
    """Set `values` on the dataclass `target`; `where` names the place in messages, `source` the file."""
    source = where if source is None else source
    known = {f.name: f for f in dataclasses.fields(target)}
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in known:
            if dotted in RENAMED:
                raise ConfigError(f"{source}: '{dotted}' is now '{RENAMED[dotted]}' (the config has sections since "
                                  "checkpoint format 2)")
            if dotted in REMOVED:
                raise ConfigError(f"{source}: '{dotted}' was removed: {REMOVED[dotted]}")
            raise ConfigError(f"{where}: unknown key '{key}' (known: {', '.join(sorted(known))})")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: '{key}' must be a mapping")
            _merge(current, value, f"{where}.{key}" if where else key, dotted, source)
        else:
            if isinstance(value, dict) and not isinstance(current, dict):  # e.g. `train.lr.x=1`: `x` is unknown
                raise ConfigError(f"{where}: '{key}' is a value, not a section (got keys {', '.join(map(str, value))})")
            if isinstance(value, str) and str(known[key].type).startswith("float"):
                # YAML 1.1 reads `1e-4` (no dot) as a string; a float field takes it as the number it is.
                try:
                    value = float(value)
                except ValueError:
                    raise ConfigError(f"{where}: '{key}' must be a number, got '{value}'") from None
            setattr(target, key, value)


def from_dict(values: dict[str, Any], where: str = "config") -> Config:
    """A config from plain data (as a checkpoint stores it), checked. Settings since removed (REMOVED)
    are dropped: a checkpoint records every setting of its day, and none of them shaped its weights."""
    config = Config()
    _merge(config, _without_removed(values), where)
    return validate(config, where)


def _without_removed(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a config as plain data) less the settings in REMOVED (a copy; sections copied as needed)."""
    kept = dict(values)
    for dotted in REMOVED:
        section, key = dotted.split(".")
        if isinstance(kept.get(section), dict) and key in kept[section]:
            kept[section] = {k: v for k, v in kept[section].items() if k != key}
    return kept


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: cannot read config ({error})") from error
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: a config must be a mapping")
    return values


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key.sub=value")
    key, raw = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then `base:` (one level), then the file, then `key.sub=value` overrides; checked."""
    config = Config()
    if path is not None:
        path = Path(path)
        values = _read_yaml(path)
        base = values.pop("base", None)
        if base is not None:
            base_path = path.parent / base
            base_values = _read_yaml(base_path)
            if "base" in base_values:
                raise ConfigError(f"{base_path}: a base config cannot name a base of its own")
            _merge(config, base_values, str(base_path))
        _merge(config, values, str(path))
    return validate(apply_overrides(config, overrides), str(path) if path is not None else "config")


def apply_overrides(config: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """Set `key.sub=value` pairs (values parsed as YAML) on a config, in place; returns it. The
    caller validates the result (load_config does; after a checkpoint's config, call validate)."""
    for text in overrides:
        keys, value = _parse_override(text)
        nested: dict[str, Any] = {keys[-1]: value}
        for key in reversed(keys[:-1]):
            nested = {key: nested}
        _merge(config, nested, f"override '{text}'")
    return config
