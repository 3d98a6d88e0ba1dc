"""docs/cli.md: every command's --help, as the parser prints it. `python -m tests.cli_reference`
rewrites the page; tests/test_cli.py fails when the page and the parser disagree."""

from __future__ import annotations

import contextlib
import io
import os

from tests.tiny import REPO

PAGE = REPO / "docs" / "cli.md"
COMMANDS = ("make-shapes", "sample-photos", "prepare", "prepare-features", "train", "evaluate", "caption", "inspect",
            "verify")
WIDTH = "100"  # argparse wraps at $COLUMNS


def help_text(*command: str) -> str:
    from captioning.cli import main

    out, before = io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*command, "--help"])
    finally:
        os.environ.pop("COLUMNS") if before is None else os.environ.__setitem__("COLUMNS", before)
    return out.getvalue()


def reference() -> str:
    sections = [f"## captioning {command}\n\n```text\n{help_text(command)}```\n" for command in COMMANDS]
    return ("# The command line\n\n"
            "Every command's `--help`, as `captioning` prints it. `python -m captioning` is the same\n"
            "command where the console script is not on the PATH. `train.py` and `eval.py` take the same\n"
            "arguments as `captioning train` and `captioning evaluate`. Written by `python -m\n"
            "tests.cli_reference`; `tests/test_cli.py` fails when this page and the parser disagree.\n\n"
            f"```text\n{help_text()}```\n\n" + "\n".join(sections))


if __name__ == "__main__":
    PAGE.write_text(reference())
    print(f"wrote {PAGE}")
