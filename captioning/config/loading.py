"""Reading a config: defaults, then a YAML file (after its chain of `base:` files), then `key.sub=value`
overrides, or plain data as a checkpoint stores it; unknown keys are errors, and the result is
checked (checks.py)."""

from __future__ import annotations

import dataclasses
import difflib
import re
import warnings
from pathlib import Path
from typing import Any

import yaml

from captioning.config.checks import validate
from captioning.config.migration import (
    MOVED,
    REDEFINED,
    REMOVED,
    RENAMED,
    RENAMED_VALUES,
    carried_over,
    now_named,
    with_keys_moved,
    with_values_renamed,
    without_removed,
)
from captioning.config.schema import Config, ConfigError, settings_of


def _closest(key: str, known: list[str]) -> list[str]:
    """The known key a misspelt one most likely meant: one it begins ("data.folder.captions" ->
    "captions_file"), else the closest spelling (difflib), else none."""
    started = sorted(name for name in known if name.startswith(key) or key.startswith(name + "_"))
    return started[:1] or difflib.get_close_matches(key, known, n=1)


def _named_elsewhere(key: str) -> list[str]:
    """The settings of any section named `key` exactly: `train.beam_size` was put in the wrong
    section, decode.beam_size, however close train.batch_size is spelt."""
    return [dotted for dotted in _every_key(Config()) if dotted.rsplit(".", 1)[-1] == key]


def _close_elsewhere(key: str) -> list[str]:
    """The setting of any section whose name is closest to `key`, where its own section has none."""
    leaves = {dotted.rsplit(".", 1)[-1]: dotted for dotted in _every_key(Config())}
    return [leaves[name] for name in difflib.get_close_matches(key, list(leaves), n=1, cutoff=0.8)]


def _every_key(section: Any, prefix: str = "") -> list[str]:
    """Every setting's and section's dotted name under a config section."""
    names = []
    for name in settings_of(section):
        dotted = f"{prefix}.{name}" if prefix else name
        names.append(dotted)
        if dataclasses.is_dataclass(getattr(section, name)):
            names += _every_key(getattr(section, name), dotted)
    return names


def _holds(values: Any, keys: list[str]) -> bool:
    """Whether the mapping `values` sets the key at path `keys`."""
    for key in keys:
        if not isinstance(values, dict) or key not in values:
            return False
        values = values[key]
    return True


def _nested_form(dotted: str) -> str:
    """'data.folder.split_seed' -> 'data: {folder: {split_seed: ...}}'."""
    *sections, leaf = dotted.split(".")
    return "".join(f"{name}: {{" for name in sections) + f"{leaf}: ..." + "}" * len(sections)


def _nested(keys: list[str], value: Any) -> dict[str, Any]:
    """["train", "lr"], 0.1 -> {"train": {"lr": 0.1}}."""
    for key in reversed(keys):
        value = {key: value}
    return value


def _merge(target: Any, values: dict[str, Any], where: str, prefix: str = "", source: str | None = None) -> None:
    """Set `values` on the dataclass `target`; `where` names the place in messages, `source` the file."""
    source = where if source is None else source
    known = settings_of(target)  # name -> its annotated type
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(key, str) and "." in key:  # `data.split_seed: 3` in a file: a section's key, not a path
            raise ConfigError(f"{source}: '{dotted}': a file nests its settings ({_nested_form(now_named(dotted))}); "
                              "key.sub=value is how an override names one")
        if dotted in MOVED and _holds(values, MOVED[dotted][len(prefix) + 1 if prefix else 0:].split(".")):
            raise ConfigError(f"{source}: '{dotted}' and '{MOVED[dotted]}' name one setting (the first is its old "
                              "name); keep one")
        if key not in known:
            if dotted in RENAMED:
                raise ConfigError(f"{source}: '{dotted}' is now '{now_named(dotted)}' (the config has sections since "
                                  "checkpoint format 2)")
            if dotted in MOVED:  # an alias: files written before the rename still read (README lists them)
                warnings.warn(f"{source}: '{dotted}' is now '{MOVED[dotted]}' (the old name still works)",
                              FutureWarning, stacklevel=2)
                # set where it lives now, below this section (as every MOVED key is)
                _merge(target, _nested(MOVED[dotted][len(prefix) + 1:].split("."), value), where, prefix, source)
                continue
            if dotted in REDEFINED:
                new, why = REDEFINED[dotted]
                raise ConfigError(f"{source}: '{dotted}' is now '{new}': {why}")
            if dotted in REMOVED:
                raise ConfigError(f"{source}: '{dotted}' was removed: {REMOVED[dotted]}")
            section = f"{prefix}." if prefix else ""
            guess = (_named_elsewhere(str(key)) or [f"{section}{name}" for name in _closest(str(key), list(known))]
                     or _close_elsewhere(str(key)))
            hint = f"did you mean '{guess[0]}'? " if guess else ""
            raise ConfigError(f"{source}: unknown key '{dotted}' ({hint}known{' in ' + prefix if prefix else ''}: "
                              f"{', '.join(sorted(known))})")
        current = getattr(target, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: '{key}' must be a mapping")
            _merge(current, value, f"{where}.{key}" if where else key, dotted, source)
        else:
            if isinstance(value, dict) and not isinstance(current, dict):  # e.g. `train.lr.x=1`: `x` is unknown
                raise ConfigError(f"{where}: '{key}' is a value, not a section (got keys {', '.join(map(str, value))})")
            if isinstance(value, str) and str(known[key]).startswith("float"):
                # YAML 1.1 reads `1e-4` (no dot) as a string; a float field takes it as the number it is.
                try:
                    value = float(value)
                except ValueError:
                    raise ConfigError(f"{where}: '{key}' must be a number, got '{value}'") from None
            renamed = RENAMED_VALUES.get(dotted, {})
            if isinstance(value, str) and value in renamed:
                raise ConfigError(f"{source}: {dotted} '{value}' is now '{renamed[value]}' (the same setting, "
                                  "named as everywhere else in the config)")
            setattr(target, key, value)


def from_dict(values: dict[str, Any], where: str = "config") -> Config:
    """A config from plain data (as a checkpoint stores it), checked. Settings since removed (REMOVED)
    are dropped: a checkpoint records every setting of its day, and none of them shaped its weights;
    settings since renamed (MOVED), or renamed with a new meaning (REDEFINED), are read under their new
    name."""
    config = Config()
    _merge(config, with_values_renamed(with_keys_moved(carried_over(without_removed(values)))), where)
    return validate(config, where, unread_sections=True)


def _repeated_key(node: yaml.Node, path: tuple[str, ...] = (),
                  seen: set[int] | None = None) -> tuple[str, int, int] | None:
    """The first key a mapping under `node` names twice, as (its dotted path, its line, the line it
    was first on); None where there is none. PyYAML keeps the last of a mapping's repeated keys
    without a word, so `hidden_dim: 64` and `hidden_dim: 128` in one section would read as 128."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already looked at (YAML anchors may even nest themselves)
        return None
    seen.add(id(node))
    children: list[tuple[tuple[str, ...], yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: the keys beside it override it, as meant
                children.append((path, value))
                continue
            name = (key.tag, str(key.value))  # `1` and `"1"` are two keys; `lr` and `"lr"` one
            if name in lines:
                return ".".join((*path, name[1])), key.start_mark.line + 1, lines[name]
            lines[name] = key.start_mark.line + 1
            children.append(((*path, name[1]), value))
    elif isinstance(node, yaml.SequenceNode):
        children = [(path, item) for item in node.value]
    for child_path, child in children:
        if (found := _repeated_key(child, child_path, seen)) is not None:
            return found
    return None


def _yaml_error(error: yaml.YAMLError) -> str:
    """A YAML error in one line: where, and what (PyYAML's own message spans several, with a picture)."""
    mark = getattr(error, "problem_mark", None)
    if isinstance(error, yaml.MarkedYAMLError) and mark is not None and error.problem:
        context = f" ({error.context})" if error.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {error.problem}{context}"
    return " ".join(str(error).split())


def _yaml(text: str, path: tuple[str, ...] = ()) -> tuple[Any, tuple[str, int, int] | None]:
    """`text` read with PyYAML's safe loader (None: no document, or an empty one), and the first key
    one of its mappings names twice (_repeated_key; `path`: the keys above it), if any."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        return loader.construct_document(node), _repeated_key(node, path)
    finally:
        loader.dispose()


def _read_yaml(path: Path) -> dict[str, Any]:
    """A config file's mapping. An empty file (or one of comments only) is refused rather than read as
    no settings: a run on the defaults that was meant to be configured would draw the embedded
    default's data into whatever data.root says."""
    try:
        values, repeated = _yaml(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config ({error.strerror or error})") from error
    except UnicodeDecodeError as error:  # another encoding, or not a text file (`--config best.pt`)
        raise ConfigError(f"{path}: cannot read config (not UTF-8 text: byte {error.start})") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: cannot read config ({_yaml_error(error)})") from error
    if repeated is not None:
        key, line, first = repeated
        raise ConfigError(f"{path}: line {line}: '{key}' is given twice in one mapping (first on line {first}); "
                          "keep one")
    if values is None:  # no document, an empty one (`---`), or a bare null
        raise ConfigError(f"{path}: the config file is empty (no settings, only blank lines or comments); write "
                          "the settings it is for, or run without a config file for the embedded default")
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: a config must be a mapping")
    return values


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key.sub=value")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    try:
        value, repeated = _yaml(raw, tuple(keys))
    except yaml.YAMLError as error:
        raise ConfigError(f"override '{text}': cannot read its value ({_yaml_error(error)})") from error
    if repeated is not None:
        raise ConfigError(f"override '{text}': '{repeated[0]}' is given twice; keep one")
    if re.search(r"(^|\s)#", raw) and "#" not in str(value):  # YAML read the rest as a comment, and dropped it
        raise ConfigError(f"override '{text}': a '#' after a space starts a comment in YAML, which would cut the value "
                          "there; quote the value (key='a #2') or leave the space out")
    return keys, value


def _settings_named(keys: list[str], value: Any, schema: Config) -> list[str]:
    """The dotted names of the settings an override sets, as it names them: `model.hard={coin: batch}`
    sets model.hard.coin; a name the schema does not know is taken as it is (merging refuses it)."""
    section: Any = schema
    for key in keys:  # down the sections the keys name
        section = getattr(section, key, None) if dataclasses.is_dataclass(section) else None
    if isinstance(value, dict) and dataclasses.is_dataclass(section):
        return [name for key, sub in value.items() for name in _settings_named([*keys, str(key)], sub, schema)]
    return [".".join(keys)]


def _refuse_two_names(parsed: list[tuple[str, list[str], Any]]) -> None:
    """Overrides apply in order, each over what came before (so a command line may add to another:
    `$COMMON model.hidden_dim=48`); but one setting under its old name and its new one (MOVED) is
    refused, as in a file: which of the two was meant cannot be told."""
    schema = Config()
    given: dict[str, tuple[str, str]] = {}  # a setting's name now -> (the name an override gave it, the override)
    for text, keys, value in parsed:
        for name in _settings_named(keys, value, schema):
            now = MOVED.get(name, name)
            if now in given and given[now][0] != name:
                other, first = given[now]
                old, new = (name, other) if name in MOVED else (other, name)
                raise ConfigError(f"overrides '{first}' and '{text}': '{old}' and '{new}' name one setting (the "
                                  "first is its old name); keep one")
            given[now] = (name, text)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the file's `base:` (and its base's, each relative to the file naming it), then
    the file, then `key.sub=value` overrides; checked."""
    config = Config()
    if path is not None:
        chain = [Path(path)]  # the file, its base, the base's base ...
        values = [_read_yaml(chain[0])]
        while (base := values[-1].pop("base", None)) is not None:
            if not isinstance(base, str):
                raise ConfigError(f"{chain[-1]}: base must be the name of one config file, relative to this one "
                                  f"(base: coco_vgg19_soft.yaml), got {base!r}")
            base_path = chain[-1].parent / base
            if any(base_path.resolve() == seen.resolve() for seen in chain):
                raise ConfigError(f"{chain[-1]}: base {base} names a file already in its chain of bases "
                                  f"({' -> '.join(str(p) for p in chain)})")
            chain.append(base_path)
            values.append(_read_yaml(base_path))
        for file, file_values in reversed(list(zip(chain, values))):  # the farthest base first
            _merge(config, file_values, str(file))
    return validate(apply_overrides(config, overrides), str(path) if path is not None else "config")


def apply_overrides(config: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """Set `key.sub=value` pairs (values parsed as YAML) on a config, in place, in order (a later one
    over an earlier); returns it. One setting under its old and its new name is refused. The
    caller validates the result (load_config does; after a checkpoint's config, call validate)."""
    parsed = [(text, *_parse_override(text)) for text in overrides]
    _refuse_two_names(parsed)
    for text, keys, value in parsed:
        _merge(config, _nested(keys, value), f"override '{text}'")
    return config
