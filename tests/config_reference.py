"""docs/config.md: every setting of a config, its default and what it does, read from the comments
beside it in the schema (captioning/config/schema.py) and in each plugin's settings dataclass.
`python -m tests.config_reference` rewrites the page; tests/config/test_config_reference.py fails
when the page and the schema disagree, or a setting says nothing of itself."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import re
import textwrap
import tokenize
from typing import Any

from tests.tiny import REPO

PAGE = REPO / "docs" / "config.md"
SECTIONS = ("data", "encoder", "model", "train", "decode")


def described(cls: type) -> dict[str, str]:
    """Each field of a dataclass with the comments written for it: the lines of comment right above
    it and the one at the end of its line; "" for a field with none."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
    said = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)) or "ClassVar" in ast.unparse(
                node.annotation):
            continue
        above, row = [], node.lineno - 1  # lines count from 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments[row])
            row -= 1
        inline = [comments[node.end_lineno]] if node.end_lineno in comments else []
        said[node.target.id] = " ".join([*above, *inline])
    return said


def _value(value: Any) -> str:
    """A default as a YAML file or an override writes it."""
    return "`{}`" if value == {} else f"`{json.dumps(value)}`"


def _rows(section: Any, prefix: str, blocks: list[str]) -> list[str]:
    """A section's settings as table rows; its subsections after it, each a block of its own."""
    from captioning.config.schema import settings_of

    notes = described(type(section))
    rows = []
    for name in settings_of(section):
        value = getattr(section, name)
        if dataclasses.is_dataclass(value):
            intro = inspect.getdoc(type(value)) or ""
            if intro.startswith(f"{type(value).__name__}("):  # the dataclass's own signature: no docstring
                intro = ""
            blocks.append(_section(value, f"{prefix}.{name}", intro=intro or notes.get(name, "")))
            continue
        rows.append(f"| `{prefix}.{name}` | {_value(value)} | {_note(notes, name, prefix).replace('|', '/')} |")
    return rows


def _note(notes: dict[str, str], name: str, prefix: str) -> str:
    """What a setting does: its own comments, or a pointer to the setting whose comments name it
    (`val_beam_size`, in the block above `val_metric`); "" where neither is there."""
    if notes.get(name):
        return notes[name]
    naming = [other for other, note in notes.items() if re.search(rf"\b{name}\b", note)]
    return f"see `{prefix}.{naming[0]}`" if naming else ""


def _section(section: Any, prefix: str, *, intro: str = "") -> str:
    blocks: list[str] = []
    rows = _rows(section, prefix, blocks)
    head = f"## `{prefix}`\n\n" + (f"{' '.join(intro.split())}\n\n" if intro else "")
    table = "| setting | default | what it does |\n|---|---|---|\n" + "\n".join(rows) + "\n" if rows else ""
    return head + table + "".join(f"\n{block}" for block in blocks)


def reference() -> str:
    from captioning.config import load_config

    config = load_config(None)
    return ("# The settings\n\n"
            "Every setting of a run's config, with the default a config file that does not name it gets, and\n"
            "what it does: a YAML file (`--config`, `configs/`) or a `key.sub=value` override sets it. The\n"
            "embedded default, `configs/shapes_soft.yaml`, gives these values. Written by `python -m\n"
            "tests.config_reference` from the comments beside each setting in `captioning/config/schema.py`\n"
            "and in each plugin's settings; `tests/config/test_config_reference.py` fails when this page and\n"
            "the schema disagree.\n\n"
            + "\n".join(_section(getattr(config, name), name) for name in SECTIONS))


if __name__ == "__main__":
    PAGE.write_text(reference())
    print(f"wrote {PAGE}")
