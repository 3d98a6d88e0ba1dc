"""Every value checked when a config is loaded, before any data, feature or model work: its type,
its range, a choice among those that exist, and combinations no run can use."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from typing import Any

import captioning.config.bounds as bounds
import captioning.config.choices as choices
import captioning.config.registry as registry
from captioning.config.schema import Config, ConfigError, DataConfig, settings_of


def _check_types(section: Any, where: str, prefix: str) -> None:
    """Every setting's value has its annotated type (int is not bool; an int is taken as a float), a
    plugin's section's as well."""
    hints = typing.get_type_hints(type(section))
    for name in settings_of(section):
        value, key = getattr(section, name), f"{prefix}.{name}"
        if dataclasses.is_dataclass(value):
            _check_types(value, where, key)
            continue
        hint = hints[name]
        optional = typing.get_origin(hint) in (types.UnionType, typing.Union)
        if optional:
            if value is None:
                continue
            hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        kind = typing.get_origin(hint) or hint
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(section, name, float(value))
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            wanted = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
                      dict: "a mapping"}[kind]
            raise ConfigError(f"{where}: {key} must be {wanted}{' or null' if optional else ''}, got {value!r}")


def _choices(config: Config) -> dict[str, tuple[str, tuple[str, ...]]]:
    c, m, t = choices, config.model, config.train
    fixed = {
        "encoder.name": (config.encoder.name, c.ENCODERS),
        "encoder.layer": (config.encoder.layer, c.LAYERS), "encoder.padding": (config.encoder.padding, c.PADDINGS),
        "model.attention": (m.attention, c.ATTENTIONS),
        "model.gate": (m.gate, c.GATES), "model.deep_output": (m.deep_output, c.DEEP_OUTPUTS),
        "model.hard.coin": (m.hard.coin, c.COINS),
        "model.extras.init": (m.extras.init, c.INITS), "model.extras.position": (m.extras.position, c.POSITIONS),
        "train.optimizer": (t.optimizer, c.OPTIMIZERS),
        "train.reinforce.baseline": (t.reinforce.baseline, c.BASELINES),
        "train.val_tokenizer": (t.val_tokenizer, c.VALIDATION_TOKENIZERS),
    }
    # every key that names a registry's entry (model.score, and model.local.base, which a plugin's
    # section holds) takes the names registered
    pluggable = {key: (_at(config, key), reg.names()) for reg in registry.REGISTRIES for key in reg.choosers}
    return {**pluggable, **fixed}


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
                "train.val_beam_size": (t.val_beam_size, 1),
                "train.num_workers": (t.num_workers, 0), "train.save_every_steps": (t.save_every_steps, 1),
                "train.log_every_steps": (t.log_every_steps, 1), "train.log_images": (t.log_images, 0),
                "train.reinforce.location_samples": (t.reinforce.location_samples, 1),
                "train.max_bad_steps": (t.max_bad_steps, 1),
                "train.reinforce.weight_warmup": (t.reinforce.weight_warmup, 0),
                "decode.beam_size": (d.beam_size, 1), "decode.max_length": (d.max_length, 1),
                "model.extras.grid_attention": (m.extras.grid_attention, 0)}
    # sizes have a bound too (bounds.py says why each is where it is)
    at_most = {"data.image_size": bounds.IMAGE_SIDE, "data.max_caption_length": bounds.LENGTH,
               "encoder.batch_size": bounds.BATCH, "model.embed_dim": bounds.WIDTH, "model.hidden_dim": bounds.WIDTH,
               "model.attention_dim": bounds.WIDTH, "model.extras.grid_attention": bounds.HEADS,
               "train.batch_size": bounds.BATCH, "train.val_beam_size": bounds.BEAM,
               "train.num_workers": bounds.WORKERS, "train.reinforce.location_samples": bounds.SAMPLES,
               "decode.beam_size": bounds.BEAM, "decode.max_length": bounds.LENGTH}
    checks = {key: _within(value, low, at_most.get(key)) for key, (value, low) in at_least.items()}
    positive = {"encoder.lr": config.encoder.lr, "train.lr": t.lr, "train.grad_clip": t.grad_clip,
                "train.dist_timeout": t.dist_timeout, "model.extras.temperature": m.extras.temperature}
    # finite too: train.lr=.inf trained NaN from the first step
    checks.update({key: (value, "positive and finite", value is None or 0 < value < math.inf)
                   for key, value in positive.items()})
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
    non_negative = {"train.ds_lambda": t.ds_lambda, "train.reinforce.weight": t.reinforce.weight,
                    "train.reinforce.entropy_weight": t.reinforce.entropy_weight,
                    "decode.length_penalty": d.length_penalty, "decode.no_repeat_ngram": d.no_repeat_ngram}
    checks.update({key: (value, "at least 0 and finite", 0 <= value < math.inf) for key, value in non_negative.items()})
    return checks


def _within(value: int | None, low: int, high: int | None) -> tuple[int | None, str, bool]:
    """(value, what it must be, whether it is) for a setting of at least `low` and at most `high`
    (None: no bound); None values (optional settings) pass."""
    if value is not None and high is not None and value > high:
        return value, f"at most {high} (far beyond any real run: captioning/config/bounds.py)", False
    return value, f"at least {low}", value is None or value >= low


def _combinations(config: Config) -> list[str]:
    """Settings that are each fine but that no run can use together."""
    m, t, e = config.model, config.train, config.encoder
    problems = []
    # a dataset format may measure more (its reader's validation_metrics: the shapes scenes' attention and relations)
    metrics = choices.VALIDATION_METRICS + getattr(registry.DATASETS[config.data.dataset], "validation_metrics", ())
    if t.val_metric not in metrics:
        problems.append(f"train.val_metric '{t.val_metric}' is not a metric that validation produces on "
                        f"data.dataset={config.data.dataset} (it produces {', '.join(metrics)})")
    if t.reinforce.baseline == "leave_one_out" and t.reinforce.location_samples < 2:
        problems.append("train.reinforce.baseline=leave_one_out needs train.reinforce.location_samples >= 2 (the "
                        f"other samples of the same caption), got {t.reinforce.location_samples}")
    problems += _chosen_plugins_problems(config)
    if m.extras.glimpses == 2 and m.attention != "soft":
        problems.append("model.extras.glimpses=2 needs model.attention=soft (the second glimpse samples nothing, "
                        "so REINFORCE would not train it)")
    if (problem := hard_choice_problem(config.decode.hard_choice, m.attention)) is not None:
        problems.append(problem)
    if t.ema_decay and e.fine_tune_from is not None:
        problems.append("train.ema_decay averages the decoder only; it does not go with encoder.fine_tune_from")
    problems += _language_problems(config.data)
    if t.graph:
        problems += _graph_problems(config)
    if config.data.augment and config.data.feature_cache and e.fine_tune_from is None:
        problems.append("data.augment needs the encoder on the fly (cached annotations are computed once per "
                        "image): set data.feature_cache=false or encoder.fine_tune_from")
    stages = choices.stage_names(e.name, e.layer)
    if e.name in choices.ENCODERS and e.layer in choices.LAYERS and not stages:
        problems.append(f"encoder.layer={e.layer} is an EfficientNet's; {e.name} takes stride16 or stride32")
    if e.fine_tune_from is not None and e.fine_tune_from not in stages:
        problems.append(f"encoder.fine_tune_from '{e.fine_tune_from}' is not a stage of {e.name} cut at {e.layer} "
                        f"(stages: {', '.join(stages)})")
    if e.cache_frozen:
        problems += _cache_frozen_problems(config, stages)
    weights = t.word_weights
    if not all(isinstance(word, str) and isinstance(weight, (int, float)) and not isinstance(weight, bool)
               and weight > 0 for word, weight in weights.items()):
        problems.append(f"train.word_weights must map words to positive numbers, got {weights!r}")
    return problems


def _graph_problems(config: Config) -> list[str]:
    """What train.graph (train/graphed.py) holds in its graph: the paper's loss (an objective whose
    entry says `paper_loss`) on the fused path, in fused Adam, on cached annotations. What the config
    cannot say (a score or an extra the fused path does not compute, a GPU without bf16, torchrun)
    the run refuses when it starts."""
    m, t, e = config.model, config.train, config.encoder
    problems = [f"train.graph needs {key}={want}, got {got}"
                for key, got, want in (("model.attention", m.attention, "soft"), ("model.fused", str(m.fused).lower(),
                                                                                  "true"),
                                       ("train.optimizer", t.optimizer, "adam")) if got != want]
    if not getattr(registry.OBJECTIVES[t.objective], "paper_loss", False):
        problems.append(f"train.graph holds the paper's loss alone, which train.objective={t.objective} is not")
    if t.terms:
        problems.append("train.graph holds the paper's loss alone: it does not go with train.terms")
    if e.fine_tune_from is not None or not config.data.feature_cache:
        problems.append("train.graph steps on cached annotations: it does not go with the encoder on the fly "
                        "(encoder.fine_tune_from, data.feature_cache=false)")
    return problems


LANGUAGE_TAG = re.compile(r"[a-z]{2,3}(-[A-Za-z0-9]{2,8})*")  # BCP 47's shape: en, de, pt-BR, zh-Hant


def _language_problems(data: DataConfig) -> list[str]:
    """The captions' language and where they come from, against what the data and the flips can do."""
    problems = []
    if not LANGUAGE_TAG.fullmatch(data.language):
        problems.append(f"data.language '{data.language}' is not a language tag (en, de, pt-BR)")
    elif data.mirror and data.language != choices.ENGLISH:
        problems.append(f"data.mirror swaps the English words for left and right (data/flips.py), and "
                        f"data.language is {data.language}")
    readers = registry.DATASETS
    if data.token_file is not None and not getattr(readers[data.dataset], "reads_token_file", False):
        takers = [name for name in readers if getattr(readers[name], "reads_token_file", False)]
        problems.append(f"data.token_file is read beside a Karpathy-format split file (data.dataset "
                        f"{', '.join(takers)}), not by data.dataset={data.dataset}")
    return problems


def _chosen_plugins_problems(config: Config) -> list[str]:
    """What each chosen plugin says of the rest of the config: a registered entry's own `problems(config)`
    (e.g. self-critical training's needs, train/scst.py), for every registry's chosen names."""
    problems = []
    for reg in registry.REGISTRIES:
        for name in dict.fromkeys(_at(config, key) for key in reg.choosers):
            rules = getattr(reg.entries.get(name), "problems", None)
            problems += rules(config) if rules is not None else []
    return problems


def _terms_problems(config: Config) -> list[str]:
    """train.terms: registered names (registry.TERMS), each with a finite number for its weight."""
    problems = []
    for name, weight in config.train.terms.items():
        if name not in registry.TERMS:
            known = ", ".join(registry.TERMS.names()) or "none registered"
            problems.append(f"train.terms: '{name}' is not a registered term ({known}; docs/architecture.md, "
                            "\"A term of the loss\")")
        elif isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            problems.append(f"train.terms: {name}'s weight must be a finite number, got {weight!r}")
    return problems


def _at(config: Config, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _sections_without_their_owner(config: Config) -> list[str]:
    """One rule for every section that one choice alone reads (a registered plugin's, or a fixed
    choice's: choices.OWNED_SECTIONS): set away from its defaults while its owner is not chosen, it
    would be taken and ignored."""
    problems = []
    for reg in registry.REGISTRIES:
        for section, owners in reg.sections().items():
            value, choosers = _at(config, section), reg.choosers
            if value == type(value)() or {_at(config, key) for key in choosers} & set(owners):
                continue
            wanted = " or ".join(f"{choosers[0]}={name}" for name in owners)
            # the other keys that choose, unless they live in the section itself (model.local.base in model.local)
            others = [key for key in choosers[1:] if not key.startswith(f"{section}.")]
            also = "".join(f" (or {key}={owners[0]})" for key in others)
            problems.append(f"{section} applies only with {wanted}{also}, not {choosers[0]}="
                            f"{_at(config, choosers[0])}: {_back_to_defaults(section, value)} or choose its owner")
    for section, owners in choices.OWNED_SECTIONS.items():
        value = _at(config, section)
        unmet = [key for key, wanted in owners if _at(config, key) != wanted]
        if value == type(value)() or not unmet:
            continue
        wanted = " and ".join(f"{key}={name}" for key, name in owners)
        problems.append(f"{section} applies only with {wanted}, not {unmet[0]}={_at(config, unmet[0])}: "
                        f"{_back_to_defaults(section, value)} or choose its owner")
    return problems


def _back_to_defaults(section: str, value: Any) -> str:
    """What to give to set a section back to its defaults, setting by setting: a base config's values
    cannot be removed, only given again (shapes_hard.yaml's train.reinforce.weight_warmup under SCST)."""
    default = type(value)()
    def as_given(setting: Any) -> str:  # as an override writes it
        return json.dumps(setting) if setting is None or isinstance(setting, (bool, dict, list)) else str(setting)

    given = [f"{section}.{field.name}={as_given(getattr(default, field.name))}" for field in dataclasses.fields(value)
             if getattr(value, field.name) != getattr(default, field.name)]
    return f"set {' '.join(given)}" if given else "remove it"


def hard_choice_problem(choice: str, attention: str) -> str | None:
    """The one rule on how hard attention picks its cell at test time, for a config's
    decode.hard_choice and for a choice asked of a model at decoding (model.attention.refuse_hard_choice):
    a choice that exists, and argmax or sampling only with hard attention. Soft attention *is* the
    expectation, so asking it for argmax or sampling is an error rather than silently ignored."""
    if choice not in choices.HARD_CHOICES:
        return f"decode.hard_choice '{choice}' is not one of {', '.join(choices.HARD_CHOICES)}"
    if attention == "soft" and choice != "expectation":
        return f"decode.hard_choice={choice} applies to hard attention only; soft attention is the expectation"
    return None


def validate(config: Config, where: str = "config", *, unread_sections: bool = False) -> Config:
    """Values that no run could use, caught before any data is read or model built; returns the config.
    `unread_sections`: take sections whose owner is not chosen (a checkpoint's config: it records what
    its run was given, and a setting its run never read must not stop it from loading)."""
    if not isinstance(config.train.word_weights, dict):
        raise ConfigError(f"{where}: train.word_weights must map words to positive numbers, "
                          f"got {config.train.word_weights!r}")
    if not isinstance(config.train.terms, dict):
        raise ConfigError(f"{where}: train.terms must map terms' names to their weights, got {config.train.terms!r}")
    for name in ("data", "encoder", "model", "train", "decode"):
        _check_types(getattr(config, name), where, name)
    for key, (value, known) in _choices(config).items():
        if value not in known:
            raise ConfigError(f"{where}: {key} '{value}' is not one of {', '.join(known)}")
    for key, (value, wanted, ok) in _ranges(config).items():
        if not ok:
            raise ConfigError(f"{where}: {key} must be {wanted}, got {value!r}")
    problems = _combinations(config) + ([] if unread_sections else  # a checkpoint's terms need not be registered here
                                        _sections_without_their_owner(config) + _terms_problems(config))
    if problems:
        raise ConfigError(f"{where}: {problems[0]}")
    return config


def _cache_frozen_problems(config: Config, stages: list[str]) -> list[str]:
    """encoder.cache_frozen: the stages before encoder.fine_tune_from are cached, so there must be
    some, and their output must be the same every epoch."""
    e, problems = config.encoder, []
    if e.fine_tune_from is None:
        problems.append("encoder.cache_frozen caches the stages before encoder.fine_tune_from, which is not set "
                        f"(e.g. encoder.fine_tune_from={stages[-1] if stages else 'layer4'})")
    elif stages and e.fine_tune_from == stages[0]:
        problems.append(f"encoder.cache_frozen: encoder.fine_tune_from={e.fine_tune_from} trains every stage, "
                        "so none is left to cache")
    if not config.data.feature_cache:
        problems.append("encoder.cache_frozen needs data.feature_cache=true (it is a feature cache)")
    if config.data.augment:
        problems.append("data.augment changes the pixels every epoch, so the frozen stages' output cannot be "
                        "cached: set encoder.cache_frozen=false")
    return problems
