"""The registries: for each pluggable setting, the names it may take, each bound to what implements it.

An implementation registers itself where it is defined, under the name a config gives:

    @SCORES.register("additive")
    class AdditiveScore(Score): ...

The config's checks read a registry's names; the code builds from its entries. So a name is
written once, where its code is, and the config (the lowest layer, docs/architecture.md) still
imports none of that code: `captioning/__init__.py` hands `fill_with` the names of the modules that
register, and Python runs that file before any module of the package. They are imported the first
time any registry is read, not before: importing the config, or building a command's parser, loads
no torch. A new score, dataset format or objective is its module plus its name in that list.

An entry with settings of its own registers their dataclass too, and the config gains that section
under the entry's name (`@SCORES.register("cosine", settings=CosineConfig)`: `model.cosine`), read,
checked and refused like any other (captioning.config.schema.Extensible), without a line in the schema.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar


class ConfigError(ValueError):
    """A config file or override that does not fit the schema: what every check of a config raises
    (defined here, the lowest of the config's modules: the schema and the registries both raise it)."""


T = TypeVar("T")


class Registry(Generic[T]):
    """One setting's names, in the order they were registered, their implementations, and the
    config sections each owns."""

    def __init__(self, setting: str, *, section: str, also_chosen_by: tuple[str, ...] = ()):
        """`section`: the config section an entry's own settings go in, under its name ("model":
        model.cosine). `also_chosen_by`: other config keys whose value names an entry too
        (model.local.base names the score the local score windows)."""
        self.setting = setting  # the config key that picks an entry, e.g. model.score
        self.section = section
        self.choosers = (setting, *also_chosen_by)
        self._entries: dict[str, T] = {}
        # config section (e.g. model.cosine) -> its settings' dataclass and the names owning it
        self._sections: dict[str, tuple[type, set[str]]] = {}

    def register(self, *names: str, settings: type | None = None) -> Callable[[T], T]:
        """A decorator: the class or function it decorates answers to each of `names`. `settings`: the
        dataclass of the settings that only it reads, which the config holds as the section
        `{self.section}.{names[0]}` (e.g. model.cosine); a config that sets it while choosing none of
        `names` is refused (captioning.config.checks)."""
        def add(entry: T) -> T:
            for name in names:
                if name in self._entries:
                    raise ValueError(f"{self.setting} '{name}' is registered twice: {self._entries[name]!r} "
                                     f"and {entry!r}")
                self._entries[name] = entry
            if settings is not None:
                key = f"{self.section}.{names[0]}"
                held = [other._sections[key][0] for other in REGISTRIES if key in other._sections]
                if held and held[0] is not settings:
                    raise ValueError(f"{key} is registered twice: {held[0]!r} and {settings!r}")
                self._sections.setdefault(key, (settings, set()))[1].update(names)
            return entry
        return add

    def sections(self) -> dict[str, tuple[str, ...]]:
        """Each owned config section -> the names that own it, in registration order."""
        entries = self.entries
        return {section: tuple(n for n in entries if n in owners) for section, (_, owners) in self._sections.items()}

    @property
    def entries(self) -> dict[str, T]:
        """Every entry, the registering modules imported first (once per process)."""
        _fill()
        return self._entries

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def __contains__(self, name: Any) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, name: str) -> T:
        if name not in self.entries:
            raise ConfigError(f"{self.setting} '{name}' is not one of {', '.join(self._entries)}")
        return self._entries[name]


_pending: list[tuple[str, ...]] = []  # module names not imported yet, in the order their entries are listed
_order: list[str] = []  # every module handed to fill_with, in that order


def fill_with(modules: tuple[str, ...]) -> None:
    """The modules that register (their dotted names, in the order their entries are listed): each is
    imported when a registry is first read."""
    _pending.append(modules)
    _order.extend(modules)


def added_sections(parent: str) -> dict[str, type]:
    """The sections that registered entries add to config section `parent` ("model"), by name, each
    its settings' dataclass; the registering modules imported first."""
    _fill()
    added = {key.split(".", 1)[1]: settings for registry in REGISTRIES if registry.section == parent
             for key, (settings, _) in registry._sections.items()}
    return dict(sorted(added.items(), key=lambda item: _rank(item[1])))  # the package's order


def _fill() -> None:
    # The list is taken before the imports run: a registering module that reads a registry while it
    # is imported sees the entries registered so far instead of starting the imports again.
    if not _pending:
        return
    while _pending:
        for module in _pending.pop(0):
            importlib.import_module(module)
    # A module imported before the first read (a test, a user's script) registered first: the
    # entries are listed in the handed order all the same, and a module not handed (a user's
    # plugin) after them, in the order it registered.
    for registry in REGISTRIES:
        registry._entries = dict(sorted(registry._entries.items(), key=lambda item: _rank(item[1])))


def _rank(entry: Any) -> int:
    module = getattr(entry, "__module__", None)
    return _order.index(module) if module in _order else len(_order)


# The attention scores (captioning.model.scores; model.local.base takes any of them but local).
SCORES: Registry[Any] = Registry("model.score", section="model", also_chosen_by=("model.local.base",))
# The local score's window: Luong's Gaussian (captioning.model.scores) or a learned shape around it
# (captioning.model.extras.window).
LOCAL_WINDOWS: Registry[Any] = Registry("model.local.window", section="model")
# The dataset formats: a reader per format (captioning.data.formats), each registered under the
# names of the datasets it reads; (data, split) -> that split's image records.
DATASETS: Registry[Callable[..., Any]] = Registry("data.dataset", section="data")
# The training objectives (captioning.train.paper_objective, captioning.train.scst).
OBJECTIVES: Registry[Any] = Registry("train.objective", section="train")
# Every registry, for the rules that hold for all of them (captioning.config.checks).
REGISTRIES = (SCORES, LOCAL_WINDOWS, DATASETS, OBJECTIVES)
# Terms added to any objective's loss (not in the paper), each weighted by train.terms: {name: weight}.
# A term is (alphas [B, T, L], mask [B, T]) -> a scalar summed over the real words and divided by
# them, as every term of the loss is (captioning.train.objective.weighted_terms; docs/architecture.md).
# Not among REGISTRIES: train.terms names several at once, with their weights.
TERMS: Registry[Callable[..., Any]] = Registry("train.terms", section="train")
