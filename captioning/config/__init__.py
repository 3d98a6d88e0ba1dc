"""Experiment configuration: nested dataclasses by section, loaded from YAML plus `key.sub=value` overrides.

A YAML file may name a `base:` file (relative to itself) whose values it overrides, and that file
a base of its own, and so on. Unknown keys are errors, never
silently ignored: a misspelt key that did nothing has cost people whole training runs. Nor is a
setting given twice where one cannot tell which was meant: a key repeated in one YAML mapping, a
setting under its old and its new name; an empty config file is refused too.

Every value is checked when the config is loaded, before any data, feature or model work; old
keys of checkpoint format 1 and settings renamed with a new meaning are migrated in a checkpoint and
refused, with their new names, in a file; settings renamed since (MOVED) are migrated in a
checkpoint and read as aliases, with a warning, in a file.

Modules: schema.py (the sections and their defaults), loading.py (files, overrides, plain data),
checks.py (`validate`: every rule on a setting's value, in one place; a plugin's own rules are
its `problems`), choices.py (what each fixed choice may be), bounds.py (the largest each size may
be), registry.py (the pluggable ones:
scores, dataset formats, objectives, and the settings sections they bring), migration.py (old keys
and removed settings), errors.py (ConfigError).
"""

from captioning.config.checks import validate
from captioning.config.loading import apply_overrides, from_dict, load_config
from captioning.config.migration import MOVED, REMOVED, RENAMED, migrate
from captioning.config.schema import (
    Config,
    ConfigError,
    DataConfig,
    DecodeConfig,
    EncoderConfig,
    ExtrasConfig,
    HardConfig,
    ModelConfig,
    ReinforceConfig,
    TrainConfig,
)

__all__ = [
    "MOVED", "REMOVED", "RENAMED", "Config", "ConfigError", "DataConfig", "DecodeConfig", "EncoderConfig",
    "ExtrasConfig", "HardConfig", "ModelConfig", "ReinforceConfig", "TrainConfig", "apply_overrides", "from_dict",
    "load_config", "migrate", "validate",
]
