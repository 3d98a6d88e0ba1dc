"""The set-up of benchmarks/gpu/gpu.py on a bare machine, without a network: each wheel of the wheels
folder (`make gpu-wheels`, wheels.py) whose modules this Python cannot import is
installed into a folder of its own, the project itself with --no-deps where it is not installed,
and then every requirement of setup.cfg and every module of the project is imported once in a
fresh process, from the folder the parts run in.

A machine that already has everything (a developer's environment) installs nothing. Every step is a
row; a step that fails says why, and the parts still run with whatever imports.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from report import FAILED, NOT_RUN, OK, Row
from wheels import LEFT_OUT, WHEELS

REPO = Path(__file__).resolve().parents[2]
PIP_SECONDS = 180  # a pip step that takes longer is stopped (a network wait would: there is none)
IMPORT_NAMES = {"pillow": "PIL", "pyyaml": "yaml"}  # distributions whose module is named otherwise


def requirements() -> dict[str, str]:
    """setup.cfg's install_requires: {distribution: the module it is imported as}."""
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    names = [re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0]
             for line in parser["options"]["install_requires"].splitlines() if line.strip()]
    return {name: IMPORT_NAMES.get(name.lower(), name.lower().replace("-", "_")) for name in names}


def wheel_modules(wheel: Path) -> list[str]:
    """The top-level modules a wheel installs: its top_level.txt, or the first part of its paths."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        listed = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        if listed:
            return [m for m in archive.read(listed[0]).decode().split() if m]
    tops = {n.split("/")[0].removesuffix(".py") for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    return sorted(tops)


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _pip(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """pip's answer; a pip that does not end in PIP_SECONDS, or cannot start, answers as a failure."""
    command = [sys.executable, "-m", "pip", *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=PIP_SECONDS, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(command, 1, "", f"{type(error).__name__}: {error}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:400] if lines else "no output"


def set_up(*, wheels: Path, site: Path) -> tuple[list[Row], dict[str, str]]:
    """Install what is missing; the rows that say what was done and the environment for the parts
    (PYTHONPATH with `site` first)."""
    rows = []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    env["PIP_NO_INDEX"], env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1", "1"  # nothing is fetched
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    missing = [w for w in found if not all(importable(m) for m in wheel_modules(w))]
    start = time.perf_counter()
    if missing:
        done = _pip("install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                    "--target", str(site), *map(str, missing), env=env)
        rows.append(Row("setup", "wheels", OK if done.returncode == 0 else FAILED,
                        "" if done.returncode == 0 else f"pip: {_last_line(done.stderr)}",
                        {"installed": [w.name for w in missing], "seconds": time.perf_counter() - start}))
    else:
        why = (f"{wheels} holds no wheels" if not found else "every wheel's modules import already")
        rows.append(Row("setup", "wheels", NOT_RUN, f"nothing to install: {why}"))
    start = time.perf_counter()
    if importable("captioning"):
        rows.append(Row("setup", "the project", NOT_RUN, "nothing to install: captioning imports already"))
    else:  # built from the tree with this Python's setuptools: nothing fetched, no dependency touched
        done = _pip("install", "-q", "--no-index", "--no-deps", "--no-build-isolation", "--no-compile",
                    "--no-cache-dir", "--target", str(site), str(REPO), env=env)
        if done.returncode != 0:  # the parts can still import it from the tree
            env["PYTHONPATH"] += os.pathsep + str(REPO)
        rows.append(Row("setup", "the project (--no-deps)", OK if done.returncode == 0 else FAILED,
                        "" if done.returncode == 0 else f"pip: {_last_line(done.stderr)}; the tree is imported "
                        "instead", {"seconds": time.perf_counter() - start}))
    rows += import_check(env, cwd=site.parent)
    return rows, env


def project_modules() -> list[str]:
    """Every module of the tree's package, by its dotted name (a subpackage that its installed copy
    lacks fails to import; `__main__` is left out: importing it runs the CLI)."""
    return sorted(".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                  for path in (REPO / "captioning").rglob("*.py")
                  if "__pycache__" not in path.parts and path.name != "__main__.py")


def import_check(env: dict[str, str], *, cwd: Path) -> list[Row]:
    """Each requirement but those the command leaves out (wheels.LEFT_OUT), and every module of the
    project, imported in a fresh process with `env`, from `cwd` (where the parts run: not the tree,
    whose package would shadow the installed one): a row for each that fails, one for all that import."""
    required = {name: module for name, module in requirements().items() if name not in LEFT_OUT}
    project = project_modules()
    modules = {**required, **{name: name for name in project}}
    script = ("import importlib, json, sys\nout = {}\nfor m in sys.argv[1:]:\n"
              "    try:\n        module = importlib.import_module(m)\n"
              "        out[m] = [True, getattr(module, '__version__', ''), getattr(module, '__file__', '') or '']\n"
              "    except Exception as e:\n        out[m] = [False, type(e).__name__ + ': ' + str(e)[:200], '']\n"
              "print(json.dumps(out))")
    try:
        done = subprocess.run([sys.executable, "-c", script, *modules.values()], capture_output=True, text=True,
                              env=env, timeout=PIP_SECONDS, cwd=cwd)
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as error:
        return [Row("setup", "imports", FAILED, f"the import check did not answer: {type(error).__name__}")]
    package = Path(seen["captioning"][2]).parent if seen["captioning"][0] else None
    for name in project:  # found outside the package (in a tree an editable install points to): not installed
        imported, _, file = seen[name]
        if imported and package is not None and not Path(file).is_relative_to(package):
            seen[name] = [False, f"imported from {file}, outside the package at {package}", file]
    fetched = {requirement.split("==")[0].lower() for requirement in WHEELS}
    rows = [Row("setup", f"import {module} ({name})", FAILED, seen[module][1] + (
        ": its wheel is not in the wheels folder (make gpu-wheels), or a module it needs is missing"
        if name.lower() in fetched else
        ": the machine's own Python must have it (no wheel brings it)"))
        for name, module in required.items() if not seen[module][0]]
    broken = [name for name in project if not seen[name][0]]
    if broken:  # one row: a requirement that is missing breaks many modules at once
        rows.append(Row("setup", "import the project's modules", FAILED, f"{len(broken)} of {len(project)} do not "
                        "import: " + "; ".join(f"{name} ({seen[name][1]})" for name in broken[:3])
                        + ("; …" if len(broken) > 3 else ""), {"modules": broken}))
    versions = {m: seen[m][1] for m in ("torch", "torchvision", "timm") if seen.get(m, [False])[0]}
    rows.append(Row("setup", "imports", OK if not rows else FAILED,
                    "" if not rows else f"{len(rows)} of {len(modules)} do not import",
                    {"imported": sum(v[0] for v in seen.values()), "of": len(modules), **versions,
                     "captioning from": str(package or "")}))
    return rows
