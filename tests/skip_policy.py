"""No silent skips: with `--allowed-skips FILE` (make test and CI pass it) a skipped test that FILE
does not list fails the run, and the summary names it with its reason.

FILE holds one test id pattern per line (fnmatch, e.g. `tests/model/test_x.py::test_y[*]`), then
`#` and why that skip is legitimate; blank lines and lines starting with `#` are comments. Without
the option nothing changes, so `make test-fast` and ad-hoc runs skip as they always did.

tests/conftest.py imports the hooks; a pytest run elsewhere can load them with `-p tests.skip_policy`.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

_skipped: dict[str, str] = {}  # test id -> reason, in the order they skipped
_refused: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--allowed-skips", metavar="FILE", default=None,
                     help="fail the run if a test skips that FILE does not allow (one id pattern, '#', a reason "
                          "per line)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("allowed_skips") is not None:  # a malformed list says so before the run, not after
        read_allowed(config.getoption("allowed_skips"))


def read_allowed(path: str | Path) -> list[str]:
    """The patterns of an allow list; a pattern without a reason is an error, not an allowance."""
    patterns = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        pattern, _, reason = text.partition("#")
        if not reason.strip():
            raise pytest.UsageError(f"{path}:{number}: '{pattern.strip()}' needs a reason after '#'")
        patterns.append(pattern.strip())
    return patterns


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):  # an expected failure is not a skip
        _skipped.setdefault(report.nodeid, _reason(report))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped at import (a module-level importorskip)
        _skipped.setdefault(report.nodeid, _reason(report))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = session.config.getoption("allowed_skips")
    if path is None:
        return
    allowed = read_allowed(path)
    _refused[:] = [test for test in _skipped if not any(fnmatch.fnmatchcase(test, p) for p in allowed)]
    if _refused and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    path = config.getoption("allowed_skips")
    if path is None:
        return
    terminalreporter.section("skip policy")
    terminalreporter.write_line(f"{len(_skipped)} skipped, {len(_skipped) - len(_refused)} of them allowed by {path}")
    for test in _refused:
        terminalreporter.write_line(f"not allowed to skip: {test} ({_skipped[test]})", red=True)
