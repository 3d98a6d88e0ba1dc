"""The paper in one file (captioning/model/paper.py): each piece of Sections 3 and 4 is defined there
and nowhere else, in the paper's order, within the length the README gives, and the README says
where it lives."""

from __future__ import annotations

import ast
import re

import pytest

from captioning.model import paper
from tests.tiny import REPO

PAPER = REPO / "captioning" / "model" / "paper.py"
# Sections 3-4 in the order the paper gives them: the score, attention, the decoder, the loss.
PIECES = ["AdditiveScore", "SoftAttention", "HardAttention", "AttentionDecoder", "cross_entropy",
          "doubly_stochastic", "Reinforce"]


@pytest.fixture(autouse=True)
def the_source_as_written() -> None:
    """These tests read the file as a reader does; mutation testing (`make mutate`) runs them on its
    instrumented copy, whose lines and names are mutmut's."""
    if "mutmut" in PAPER.read_text():
        pytest.skip("captioning/model/paper.py is mutmut's instrumented copy here")


def test_the_paper_is_one_file_within_the_length_the_readme_gives() -> None:
    lines = len(PAPER.read_text().splitlines())
    readme = " ".join((REPO / "README.md").read_text().split())
    said = re.search(r"\[`captioning/model/paper\.py`\]\(captioning/model/paper\.py\)\*\*: Sections 3 and 4 top to "
                     r"bottom in (\d+) lines", readme)
    assert said is not None, "the README's first screen says where the paper lives, and in how many lines"
    assert lines <= 450 and int(said[1]) == lines


def test_each_piece_is_defined_in_the_paper_file_in_the_papers_order() -> None:
    tree = ast.parse(PAPER.read_text())
    defined = [node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))]
    assert [name for name in defined if name in PIECES] == PIECES
    for name in PIECES:
        assert getattr(paper, name).__module__ == "captioning.model.paper", name


def test_no_other_module_defines_a_piece_of_the_paper() -> None:
    """Everything else wraps or imports the paper's pieces: a second definition would be a second
    copy of an equation."""
    twice = []
    for path in sorted((REPO / "captioning").rglob("*.py")):
        if path == PAPER:
            continue
        tree = ast.parse(path.read_text())
        twice += [f"{path.relative_to(REPO)}: {node.name}" for node in ast.walk(tree)
                  if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in PIECES]
    assert twice == []
