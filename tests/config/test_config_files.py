"""The config files in configs/: each that names a `base:` sets only what differs from what its chain
of bases (and the defaults under them) already gives, so that every line says something; and
shapes_soft.yaml, the root of the shapes configs, is the embedded default written out."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from captioning.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DERIVED = sorted(path.name for path in CONFIGS.glob("*.yaml") if "base" in (yaml.safe_load(path.read_text()) or {}))


def repeated(values: dict[str, Any], resolved: Any, prefix: str = "") -> list[str]:
    """The dotted keys of `values` (a file's YAML) whose value `resolved` (its base's config) already has."""
    found = []
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        current = getattr(resolved, key)
        if dataclasses.is_dataclass(current):
            found += repeated(value, current, f"{dotted}.")
            continue
        if isinstance(value, str) and isinstance(current, float):
            value = float(value)  # YAML 1.1 reads 1e-4 as a string; the loader takes it as the number
        if value == current and isinstance(value, bool) == isinstance(current, bool):
            found.append(f"{dotted}: {value!r}")
    return found


def test_the_configs_have_bases():
    assert len(DERIVED) >= 10  # the glob found the folder


@pytest.mark.parametrize("name", DERIVED)
def test_a_config_repeats_nothing_its_base_gives(name):
    values = yaml.safe_load((CONFIGS / name).read_text())
    base = values.pop("base")
    assert repeated(values, load_config(CONFIGS / base, [])) == [], f"{name} sets these as {base} already gives them"


def test_the_embedded_default_is_shapes_soft_yaml():
    """`python train.py` with no --config trains what `make demo` trains and the README's numbers come
    from: configs/shapes_soft.yaml, setting for setting."""
    default, written = load_config(None).to_dict(), load_config(CONFIGS / "shapes_soft.yaml").to_dict()
    differ = {f"{section}.{key}": (value, written[section][key]) for section, values in default.items()
              for key, value in values.items() if written[section][key] != value}
    assert default.keys() == written.keys() and differ == {}, differ
