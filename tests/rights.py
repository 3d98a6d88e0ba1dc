"""Commands run as a user without write rights, for the tests of read-only, shared and moved data.

The tests run as root in CI, and root ignores file modes. `setpriv` drops the capabilities that let
it (overriding modes, reading past them, acting as every file's owner), so that a command sees files
as an ordinary user would: its own (uid 0's) by their owner bits, another user's (here uid 65534's)
by their "other" bits. Run as an ordinary user, the command runs as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.tiny import REPO

ANOTHER_USER = 65534  # nobody: owns what a shared dataset's owner would
DROPPED = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]


def _prefix() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: root cannot be made to respect file modes here")
    return DROPPED


def without_write_rights(command: Sequence[str], **options) -> subprocess.CompletedProcess:
    """`command` run with the rights files' modes give (root's capabilities dropped), from the
    repository, with this checkout's package first on the path; its output captured as text."""
    environment = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   "CAPTIONING_QUIET": "1", **options.pop("env", {})}
    return subprocess.run([*_prefix(), *command], capture_output=True, text=True, cwd=REPO, env=environment,
                          timeout=options.pop("timeout", 300), **options)


def read_only(*paths: Path) -> None:
    """Every file and folder under `paths` without write bits (chmod -R a-w)."""
    for path in paths:
        for item in [path, *path.rglob("*")]:
            if not item.is_symlink():
                item.chmod(item.stat().st_mode & ~0o222)


def writable_again(*paths: Path) -> None:
    for path in paths:
        for item in [path, *path.rglob("*")]:
            if not item.is_symlink():
                item.chmod(item.stat().st_mode | 0o200)


def as_another_user(command: Sequence[str], *, owner_of: Sequence[Path], writable: Sequence[Path],
                    **options) -> subprocess.CompletedProcess:
    """`command` run by a user who does not own `owner_of` (another user's shared dataset, readable by
    all: handed to uid 65534 for the run, then back) and may write to `writable` (folders of its own)."""
    if os.geteuid() != 0:
        pytest.skip("handing files to another user needs root (the tests run as root in CI)")
    for folder in writable:
        folder.mkdir(parents=True, exist_ok=True)
    owned = [item for path in owner_of for item in [path, *path.rglob("*")]]
    for item in owned:
        if item.is_dir() and not item.is_symlink():  # pytest makes its folders its owner's alone
            item.chmod(item.stat().st_mode | 0o055)
        os.chown(item, ANOTHER_USER, ANOTHER_USER, follow_symlinks=False)
    try:
        return without_write_rights(command, **options)
    finally:
        for item in owned:
            os.chown(item, 0, 0, follow_symlinks=False)
