"""The package as `pip install .` builds it, not the tree: the tests, an editable install and
`python -m` all import the tree, where a folder without `__init__.py` still imports (a namespace
package) but setup.cfg's `packages = find:` leaves it out of every wheel. So here the project is
installed into a folder of its own and must hold every file of the tree's package, and every module
must import from there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.tiny import REPO

IMPORT_ALL = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = f"{type(error).__name__}: {error}"
print(json.dumps({"failed": failed, "from": importlib.import_module("captioning").__file__}))
"""


# mutation testing's copy of the tree keeps its records beside each module it mutates (api.py.meta)
MUTMUT_RECORDS = (".py.meta", ".py.spans")


def _files(root: Path) -> set[Path]:
    package = root / "captioning"
    return {path.relative_to(root) for path in package.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(MUTMUT_RECORDS)}


def test_a_wheel_install_holds_every_file_of_the_package_and_every_module_imports_from_it(tmp_path: Path) -> None:
    source, site = tmp_path / "source", tmp_path / "site"
    # built from a copy: setuptools keeps the tree's build/lib from an earlier build and would ship it
    shutil.copytree(REPO / "captioning", source / "captioning", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "--no-compile", "--target", str(site), str(source)], check=True, cwd=tmp_path, timeout=300,
                   env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert sorted(map(str, _files(REPO) - _files(site))) == []  # a subpackage or a data file left out

    modules = sorted(".".join(path.with_suffix("").parts).removesuffix(".__init__") for path in _files(REPO)
                     if path.suffix == ".py" and path.name != "__main__.py")  # __main__ would run the CLI
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *modules], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)}, check=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(answer["from"]).is_relative_to(site)  # the installed copy, not the tree or an editable install
    assert answer["failed"] == {}
    assert len(modules) > 50  # the tree was walked, not an empty folder
