"""Experiment configuration: nested dataclasses by section, loaded from YAML plus `key.sub=value` overrides.

A YAML file may name one `base:` file (relative to itself) whose values it overrides; bases do not
chain further, so any config can be read in two files at most. Unknown keys are errors, never
silently ignored: a misspelt key that did nothing has cost people whole training runs.

Every value is checked when the config is loaded, before any data, feature or model work; old
keys of checkpoint format 1 (and settings renamed with a new meaning) are migrated in a checkpoint and
refused, with their new names, in a file.

Modules: schema.py (the sections and their defaults), loading.py (files, overrides, plain data),
checks.py (`validate`), choices.py (what each setting may be), migration.py (old keys and removed
settings).
"""

from captioning.config.checks import validate
from captioning.config.choices import DATASETS
from captioning.config.loading import apply_overrides, from_dict, load_config
from captioning.config.migration import REMOVED, RENAMED, migrate
from captioning.config.schema import (
    Config,
    ConfigError,
    CosineConfig,
    DataConfig,
    DecodeConfig,
    EncoderConfig,
    ExtrasConfig,
    HardConfig,
    LocalConfig,
    ModelConfig,
    ReinforceConfig,
    ScstConfig,
    TrainConfig,
)

__all__ = [
    "DATASETS", "REMOVED", "RENAMED", "Config", "ConfigError", "CosineConfig", "DataConfig", "DecodeConfig",
    "EncoderConfig", "ExtrasConfig", "HardConfig", "LocalConfig", "ModelConfig", "ReinforceConfig", "ScstConfig",
    "TrainConfig", "apply_overrides", "from_dict", "load_config", "migrate", "validate",
]
