"""Experiment configuration: nested dataclasses, loaded from YAML plus `key.sub=value` overrides.

A YAML file may name one `base:` file (relative to itself) whose values it overrides; bases do not
chain further, so any config can be read in two files at most. Unknown keys are errors, never
silently ignored: a misspelt key that did nothing has cost people whole training runs.
"""

from __future__ import annotations

import dataclasses
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
    # shorter side and colour jitter (data/images.py: augment). Never a plain horizontal flip: it
    # would make "to the left of" in the caption false (data.mirror flips and swaps the words).
    augment: bool = False
    # Training pairs only: on a coin per pair and epoch, the image mirrored left-right and "left" and
    # "right" swapped in its caption (data/mirror.py). Off by default (not in the paper). With the
    # feature cache, the mirror images get a cache of their own (train_mirrored).
    mirror: bool = False


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
class ModelConfig:
    embed_dim: int = 128
    hidden_dim: int = 256
    attention_dim: int = 128
    score: str = "additive"  # the attention score function (see captioning.attention.SCORES)
    attention: str = "soft"  # how the weights are used: soft (Sec. 4.2) or hard (Sec. 4.1)
    temperature: float = 1.0  # alpha = softmax(e / temperature)
    # 2-D position (off by default): "learned" adds a learned position to the annotations
    # (attention.GridPosition); "coordinates" appends each cell's (x, y) (attention.GridCoordinates).
    position: str = "none"
    local_base: str = "additive"  # the content score under the `local` score's Gaussian window
    local_window: str = "gaussian"  # the local score's window: "gaussian" (Luong), or "learned" (scores.LocalScore)
    local_sigma: float | None = None  # its width in grid cells (None: a quarter of the grid's longer side)
    # the cosine score's beta at the start, then learned (None: 5); also the local score's cosine base
    cosine_sharpness: float | None = None
    unit_annotations: bool = False  # rescale each annotation to norm sqrt(D) before attention (see attention.py)
    # Hard attention, training: the chance that an image uses the soft expectation instead of samples
    # (Sec. 4.1: 0.5), one coin per "image" or one per "batch" (as the authors' code did).
    hard_expectation_prob: float = 0.5
    hard_coin: str = "image"
    hard_warmup: int = 0  # batches over which that chance falls from 1 (soft) to hard_expectation_prob
    gate: str = "scalar"  # the paper's scalar beta; "vector" is the per-channel gate some ports use
    # The deep output layer (Eq. 7): "linear" as printed, L_o(E y + L_h h + L_z z); "tanh" as the
    # authors' code (arctic-captions capgen.py), L_o(tanh(E y + L_h h + L_z z)).
    deep_output: str = "linear"
    # h_0, c_0 from the mean annotation (Sec. 3.1.2: "mean"), or from the mean and a small projection
    # of every cell in grid order ("layout": the decoder starts out knowing where things are).
    init: str = "mean"
    # Glimpses per word (not in the paper): 2 adds a second soft attention whose query is h_{t-1}
    # and the first glimpse's context, so that one word can see two places (the two objects of a
    # relation); z_t is both contexts side by side, and the map reported for the word (overlays,
    # attention correctness) is the mean of the two. See captioning.decoder.
    glimpses: int = 1
    # The attention query: h_{t-1} alone (the paper, Eq. 4), or also the previous word's embedding,
    # [h_{t-1}; E y_{t-1}] (not in the paper; Anderson et al. 2018's attention LSTM reads the word
    # before attending). h_{t-1} predicted y_{t-1} and has not seen which word was chosen, so after
    # "a red" the map for the next word cannot look for the red one of two squares (captioning.model.decoder).
    query_word: bool = False
    dropout: float = 0.3


@dataclass
class TrainConfig:
    out_dir: str = "runs/shapes_soft"
    seed: int = 0
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: str = "adam"  # adam | rmsprop (the paper: RMSProp on Flickr8k, Adam on Flickr30k and COCO)
    grad_clip: float = 5.0
    # Doubly stochastic regularization (Eq. 14). "one" is the paper's target of 1 per cell;
    # "length" is T/L, which a caption of T words over L cells can actually meet.
    ds_weight: float = 0.0
    ds_target: str = "one"
    # Target words whose cross-entropy counts this many times, e.g. {above: 4} (not in the paper;
    # empty: every word counts once). For the word that decides a spatial relation, one token in ten
    # of a shapes caption (docs/attention.md); the loss is still divided by the number of words.
    word_weights: dict[str, float] = field(default_factory=dict)
    val_metric: str = "CIDEr"  # from greedy decoding of the validation split
    lr_decay: float = 0.5  # multiply the learning rate by this when the metric stalls...
    lr_patience: int = 1  # ...for this many evaluations
    early_stop_patience: int = 3
    max_steps: int | None = None  # stop after this many optimizer steps (tests, quick looks)
    eval_every_steps: int | None = None  # also evaluate mid-epoch every this many steps
    val_images: int | None = None  # decode only the first N validation images when evaluating
    num_workers: int = 0
    pin_memory: bool = True  # only used when training on a GPU
    save_every_steps: int | None = None  # also write last.pt every this many steps (resume after a kill)
    log_every_steps: int = 10  # losses to TensorBoard and log.jsonl
    log_images: int = 3  # validation images with per-word overlays in TensorBoard at each evaluation
    amp: bool = False  # autocast: bf16 where supported, else fp16 with a gradient scaler
    compile: bool = False  # torch.compile the decoder
    # Hard attention's REINFORCE terms (Sec. 4.1): lambda_r, lambda_e, the baseline (none,
    # moving_average = the paper's, leave_one_out) and its decay, and samples of locations per
    # caption (its rows are repeated; leave_one_out needs 2 or more). Soft attention ignores them.
    reinforce_weight: float = 1.0
    entropy_weight: float = 0.0
    baseline: str = "moving_average"
    baseline_decay: float = 0.9
    samples: int = 1
    reinforce_warmup: int = 0  # batches over which both terms grow from 0 (not in the paper; see losses.Reinforce)
    # Polyak averaging of the decoder's weights (not in the paper; 0 = off): after each step the
    # average moves 1 - ema_decay of the way to the new weights, and validation, best.pt and the
    # checkpoint's "decoder" use the average (e.g. 0.999: about the last 1,000 steps).
    ema_decay: float = 0.0


@dataclass
class DecodeConfig:
    beam_size: int = 3
    max_length: int = 20
    length_penalty: float = 0.0  # score / length**alpha when ranking finished beams; 0 = raw log-prob
    hard_attention: str = "expectation"  # how hard attention picks its cell: expectation, argmax or sample


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


def validate(config: Config, where: str = "config") -> Config:
    """Values that no run could use, caught before any data is read or model built."""
    from captioning.model.encoder import ENCODERS, PADDINGS

    choices = {"data.dataset": (config.data.dataset, DATASETS), "encoder.name": (config.encoder.name, ENCODERS),
               "encoder.layer": (config.encoder.layer, ("stride16", "stride32")),
               "encoder.padding": (config.encoder.padding, PADDINGS),
               "model.deep_output": (config.model.deep_output, ("linear", "tanh")),
               "model.init": (config.model.init, ("mean", "layout")),
               "train.optimizer": (config.train.optimizer, ("adam", "rmsprop"))}
    for key, (value, known) in choices.items():
        if value not in known:
            raise ConfigError(f"{where}: {key} '{value}' is not one of {', '.join(known)}")
    positive = {"data.image_size": config.data.image_size, "train.batch_size": config.train.batch_size,
                "encoder.batch_size": config.encoder.batch_size, "train.log_every_steps": config.train.log_every_steps}
    for key, value in positive.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    weights = config.train.word_weights
    if not isinstance(weights, dict) or not all(
            isinstance(word, str) and isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight > 0
            for word, weight in weights.items()):
        raise ConfigError(f"{where}: train.word_weights must map words to positive numbers, got {weights!r}")
    if not 0.0 <= config.train.ema_decay < 1.0:
        raise ConfigError(f"{where}: train.ema_decay must be in [0, 1), got {config.train.ema_decay!r}")
    if config.train.ema_decay and config.encoder.fine_tune_from is not None:
        raise ConfigError(f"{where}: train.ema_decay averages the decoder only; it does not go with "
                          "encoder.fine_tune_from")
    if config.model.glimpses not in (1, 2):
        raise ConfigError(f"{where}: model.glimpses must be 1 or 2, got {config.model.glimpses!r}")
    if config.model.glimpses == 2 and config.model.attention != "soft":
        raise ConfigError(f"{where}: model.glimpses=2 needs model.attention=soft (the second glimpse samples "
                          "nothing, so REINFORCE would not train it)")
    if config.data.augment and config.data.feature_cache and config.encoder.fine_tune_from is None:
        raise ConfigError(f"{where}: data.augment needs the encoder on the fly (cached annotations are computed "
                          "once per image): set data.feature_cache=false or encoder.fine_tune_from")
    return config


def _merge(target: Any, values: dict[str, Any], where: str) -> None:
    known = {f.name: f for f in dataclasses.fields(target)}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key '{key}' (known: {', '.join(sorted(known))})")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: '{key}' must be a mapping")
            _merge(current, value, f"{where}.{key}" if where else key)
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
    config = Config()
    _merge(config, values, where)
    return config


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
    """Defaults, then `base:` (one level), then the file, then `key.sub=value` overrides."""
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
    """Set `key.sub=value` pairs (values parsed as YAML) on a config, in place; returns it."""
    for text in overrides:
        keys, value = _parse_override(text)
        nested: dict[str, Any] = {keys[-1]: value}
        for key in reversed(keys[:-1]):
            nested = {key: nested}
        _merge(config, nested, f"override '{text}'")
    return config
