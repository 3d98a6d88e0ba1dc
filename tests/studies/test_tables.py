"""`make tables` rewrites every study table from the kept results: on this checkout, to the very
bytes committed. A script that no longer finds its kept results (a renamed result file, a renamed
key) writes a table of dashes, and nothing else would notice until someone read the page."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import REPO

pytestmark = pytest.mark.study


def _table_commands() -> list[list[str]]:
    """The Makefile's `tables` target, as the commands it runs."""
    recipe = re.search(r"^tables:.*?\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), flags=re.M).group(1)
    return [line.strip().split()[1:] for line in recipe.splitlines()]


def test_the_tables_from_the_kept_results_are_the_committed_tables(tmp_path: Path) -> None:
    commands = _table_commands()
    assert len(commands) == 6 and all(command[-1] == "--tables-only" for command in commands)
    for folder in ("studies", "docs", "configs"):  # they write beside themselves: into a copy, the checkout untouched
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    for command in commands:
        done = subprocess.run([sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    changed = [str(path.relative_to(tmp_path)) for path in sorted(tmp_path.rglob("*"))
               if path.is_file() and (REPO / path.relative_to(tmp_path)).read_bytes() != path.read_bytes()]
    assert changed == []
