"""The skip policy of make test (tests/skip_policy.py), run on a small test file in a pytest of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.tiny import REPO

SKIPPING = '''
import pytest

def test_runs():
    pass

def test_needs_a_tool():
    pytest.skip("the tool is not installed")
'''
SKIPPING_MODULE = '''
import pytest

pytest.importorskip("no_module_of_this_name")

def test_never_collected():
    pass
'''


def run_pytest(folder: Path, *options: str) -> subprocess.CompletedProcess:
    """pytest on folder's tests with the policy's hooks and nothing of this repository's config."""
    (folder / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.skip_policy",
                           "-c", str(folder / "pytest.ini"), "--rootdir", str(folder), str(folder), *options],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_a_skip_the_allow_list_does_not_name_fails_the_run_and_is_named(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(SKIPPING)
    (tmp_path / "test_module.py").write_text(SKIPPING_MODULE)
    allow = tmp_path / "allowed.txt"
    allow.write_text("# nothing may skip\n")
    refused = run_pytest(tmp_path, f"--allowed-skips={allow}")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "not allowed to skip: test_some.py::test_needs_a_tool (the tool is not installed)" in refused.stdout
    assert "not allowed to skip: test_module.py (could not import 'no_module_of_this_name'" in refused.stdout
    assert "2 skipped, 0 of them allowed" in refused.stdout

    allow.write_text("test_some.py::test_needs_*  # the tool is optional here\n"
                     "test_module.py  # so is the module\n")
    allowed = run_pytest(tmp_path, f"--allowed-skips={allow}")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "2 skipped, 2 of them allowed" in allowed.stdout

    assert run_pytest(tmp_path).returncode == 0  # without the option (make test-fast, ad-hoc runs): as before


def test_an_allowance_without_a_reason_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(SKIPPING)
    allow = tmp_path / "allowed.txt"
    allow.write_text("test_some.py::test_needs_a_tool\n")
    result = run_pytest(tmp_path, f"--allowed-skips={allow}")
    assert result.returncode != 0 and "needs a reason" in result.stdout + result.stderr
