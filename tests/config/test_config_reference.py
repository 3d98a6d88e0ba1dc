"""docs/config.md is every setting with its default and what it does, as the schema's comments say."""

from __future__ import annotations

import re

from tests.config_reference import PAGE, reference


def test_docs_config_md_is_the_schema_as_it_is() -> None:
    assert PAGE.read_text() == reference(), "docs/config.md is stale: python -m tests.config_reference"


def test_every_setting_says_what_it_does() -> None:
    """A setting with no comment of its own, and named in no other's, is a blank row on the page."""
    rows = [line for line in reference().splitlines() if line.startswith("| `")]
    assert len(rows) > 100  # every section, the plugins' included
    assert [row.split(" | ")[0] for row in rows if re.search(r"\|\s*\|$", row)] == []
