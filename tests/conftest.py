"""Shared fixtures: a tiny shapes dataset with its feature cache, and a tiny model trained on it
(sizes in tests/tiny.py). The features are computed once per session; every fixture that trains
reuses that cache."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch

from captioning.config import Config, load_config
from tests.skip_policy import (  # noqa: F401  (hooks: make test fails on a skip it does not allow)
    pytest_addoption,
    pytest_collectreport,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
from tests.tiny import COUNTS, IMAGE_SIZE, TINY

# Every tensor here is tiny and the machines are small (2 cores): one intra-op thread avoids
# oversubscription, which made the decoder steps several times slower when anything else ran.
torch.set_num_threads(1)

if os.environ.get("CAPTIONING_TEST_FIXTURES"):
    # Mutation testing forks every mutant from a process that has imported the tests: imported
    # here, timm (the encoders' backbones, imported where an encoder is built) is not imported again
    # by every mutant (1.4 s each on this machine).
    import timm  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def mutmut_stats_stay_in_this_process():
    """Mutation testing (`make mutate`) first runs the suite once with MUTANT_UNDER_TEST=stats to see
    which tests call which function. A test that starts Python in a subprocess (torchrun, the
    command line) would pass that on, and the subprocess, outside mutants/, fails to record anything.
    mutmut keeps its own copy of the setting in this process, so the environment can drop it."""
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        del os.environ["MUTANT_UNDER_TEST"]
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under mutation testing, a mutant's tests run fastest first (by the durations of mutmut's
    recording run), so that a killed mutant stops at the cheapest test that fails. mutmut 3.8.1's
    fork server (`process_isolation = forkserver`) hands a mutant's tests to pytest in the order of a
    Python set: a killed mutant of the feature cache then ran about 40 s of tests, not 5."""
    # No order of ours for `make test`: pytest-xdist hands its two workers the files with the most
    # tests first, so the slow tests' files (training, killing and rank tests, few tests each) mostly
    # come late and apart. Handed out first, in the order collected (--no-loadscope-reorder), they
    # ran together and overfilled the 2 cores: 764 s against 502 s, back to back (docs/history.md).
    if "__mutmut_" not in os.environ.get("MUTANT_UNDER_TEST", ""):
        return
    stats = Path(config.rootpath) / "mutmut-stats.json"  # in mutants/, where mutmut runs pytest
    if stats.exists():
        durations = json.loads(stats.read_text())["duration_by_test"]
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))


@dataclass(frozen=True)
class TinyRun:
    data_root: Path  # the shapes dataset, with its feature cache under features/
    overrides: tuple[str, ...]  # data.root and the tiny sizes, for train.py / eval.py command lines
    run_dir: Path  # train.out_dir of the tiny run
    checkpoint: Path  # best.pt
    last: Path  # last.pt
    steps: int


@functools.cache
def _built_from() -> str:
    """A hash of the package and the tests' set-up: what the shared fixtures are built from."""
    here = Path(__file__).resolve().parent
    sources = sorted((here.parent / "captioning").rglob("*.py")) + [here / "conftest.py", here / "tiny.py"]
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]


def _repository_state() -> str:
    """The project's commit and whether the tree differs from it, as a checkpoint's record keeps them
    (captioning.train.provenance.project_commit): a fixture built before a commit or an edit would
    otherwise hold a record that `verify` finds changed. Asked each time, not once a process:
    mutation testing forks its mutants from one process that lives for hours."""
    from captioning.train.provenance import project_commit

    return hashlib.sha256(str(project_commit()).encode()).hexdigest()[:8]


def built_once(name: str, build: Callable[[Path], None], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that `build` fills: a fresh one per session, or, where CAPTIONING_TEST_FIXTURES names
    a folder (`make mutate` does), one shared by every process and built once, by unmutated code.

    Mutation testing forks a process per mutant, so a session fixture would be built again for each
    one (the tiny run's training alone takes seconds); most mutants' first test needs it. Shared, a
    mutant is killed by the tests that call it, not by a fixture it would have built wrong. The folder
    is keyed by the code and test set-up it was built from and by the repository's state, so an edit
    or a commit builds a new one."""
    shared = os.environ.get("CAPTIONING_TEST_FIXTURES")
    if not shared:
        path = tmp_path_factory.mktemp(name)
        build(path)
        return path
    path = Path(shared) / f"{name}-{_built_from()}-{_repository_state()}"
    Path(shared).mkdir(parents=True, exist_ok=True)
    with open(Path(shared) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two mutants starting at once: one builds, the other waits
        if not (path / ".built").exists():
            # mutmut's switch: "" runs the original code
            with mock.patch.dict(os.environ, {"MUTANT_UNDER_TEST": ""}):
                if path.exists():
                    shutil.rmtree(path)  # a build that was stopped half way
                path.mkdir()
                build(path)
            (path / ".built").touch()
    return path


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny shapes dataset whose train/val/test features are already cached."""
    from captioning.data.shapes.scenes import make_shapes
    from captioning.data.splits import load_splits

    def build(root: Path) -> None:
        make_shapes(root, COUNTS, seed=0, image_size=IMAGE_SIZE)
        load_splits(load_config(None, [f"data.root={root}", *TINY]), ("train", "val", "test"))

    return built_once("shapes", build, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_config(shapes_root: Path) -> Callable[..., Config]:
    """tiny_config(out_dir, "key=value", ...) -> a tiny config on the session's shapes data."""

    def make(out_dir: str | Path, *overrides: str) -> Config:
        return load_config(None, [f"data.root={shapes_root}", *TINY, f"train.out_dir={out_dir}", *overrides])

    return make


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, shapes_root: Path,
             tiny_config: Callable[..., Config]) -> TinyRun:
    """A tiny model trained for a few steps: best.pt / last.pt for the CLI and evaluation tests."""
    from captioning.train.loop import fit

    steps = 80  # enough for captions that name shapes ("a red diamond"), so attention gets scored

    def build(run_dir: Path) -> None:
        summary = fit(tiny_config(run_dir, f"train.max_steps={steps}"))
        assert summary["steps"] == steps

    run_dir = built_once("run", build, tmp_path_factory)
    return TinyRun(data_root=shapes_root, overrides=(f"data.root={shapes_root}", *TINY), run_dir=run_dir,
                   checkpoint=run_dir / "best.pt", last=run_dir / "last.pt", steps=steps)


@pytest.fixture(scope="session")
def encoder():
    """The real frozen encoder, built once."""
    from captioning.model.encoder import build_encoder

    return build_encoder(name="efficientnet_lite0", layer="stride16")


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails loudly instead of reaching out (tests never download)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="session")
def resnet18_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local ResNet-18 weights file with random weights: the real torchvision loading path, offline."""
    import torchvision

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "resnet18_random.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return path

