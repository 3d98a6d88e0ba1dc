"""Every benchmark script imports and answers --help (they run as scripts: `python benchmarks/run.py`,
each importing its siblings), so that a renamed function in the package cannot break them unseen.
What they measure is checked elsewhere: tests/model/test_fused.py holds the fast paths against
benchmarks/reference.py and benchmarks/port_style.py."""

from __future__ import annotations

import importlib
import sys

import pytest

from tests.tiny import REPO

SCRIPTS = ("run", "ab", "flops", "feature_cache")


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_script_imports_and_answers_help(name, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # as `python benchmarks/NAME.py` has it
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 0
    assert "usage:" in capsys.readouterr().out
