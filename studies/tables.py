"""What the studies share: their command line and the table each one rewrites between its own
markers in its README, so that no number in a table is typed by hand."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the repository: studies run from anywhere


def study_parser(doc: str, *, data: str, out: str | None, results: str, data_help: str,
                 table_doc: str) -> argparse.ArgumentParser:
    """--data, --out (checkpoints; none for a study that trains nothing), --results (one metrics file
    per run, committed), --doc (where its table goes), --only and --tables-only, with this study's
    defaults."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=data, help=data_help)
    if out is not None:
        parser.add_argument("--out", default=out, help="checkpoints")
    parser.add_argument("--results", default=results, help="one metrics file per run")
    parser.add_argument("--doc", default=table_doc)
    parser.add_argument("--only", help="run only the configurations whose name contains this")
    parser.add_argument("--tables-only", action="store_true", help="rewrite the doc from the kept results")
    return parser


def write_between(doc: Path, marker: str, command: str, text: str) -> None:
    """Replace what lies between <!-- MARKER:start (COMMAND) --> and <!-- MARKER:end --> in `doc`
    with `text`, adding the markers at the end if they are not there yet."""
    start, end = f"<!-- {marker}:start ({command}) -->", f"<!-- {marker}:end -->"
    body = doc.read_text() if doc.exists() else ""
    if start not in body:
        body += f"\n{start}\n{end}\n"
    body = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{text}\n{end}", body, flags=re.S)
    doc.write_text(body)
