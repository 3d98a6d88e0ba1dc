"""docs/benchmarks.md and docs/testing.md are references, not lab notebooks: the benchmarks page
opens with one headline table, each number of which is its linked section's; the testing page is
short and holds the mutation scores as one table; the dated passages live in docs/history.md; and
every link into or out of these three pages lands on a heading that is there; and every module,
class or function of the package a page names is there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tiny import REPO

DOCS = REPO / "docs"
PAGES = ("benchmarks.md", "testing.md", "history.md")
NUMBER = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?")  # 16,198 or 0.51, not the 16 of fp16
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _headings(text: str) -> list[tuple[int, str, int]]:
    """(line index, anchor, level) of each heading outside code blocks, anchors as GitHub makes them."""
    found, seen, fenced = [], {}, False
    for index, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+) (.*)", line)
        if heading:
            anchor = re.sub(r"[^\w\- ]", "", heading.group(2).strip().lower()).replace(" ", "-")
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.append((index, f"{anchor}-{count}" if count else anchor, len(heading.group(1))))
    return found


def _section(text: str, anchor: str) -> str:
    """The heading's section: its lines up to the next heading of its level or above."""
    lines, headings = text.splitlines(), _headings(text)
    start, level = next((index, level) for index, name, level in headings if name == anchor)
    end = next((index for index, _, other in headings if index > start and other <= level), len(lines))
    return "\n".join(lines[start:end])


def _tables(text: str) -> list[list[list[str]]]:
    """Each table's rows (header first, the separator left out) as lists of cells."""
    tables, current = [], None
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if current is None:
                current = []
                tables.append(current)
            if not all(set(cell) <= set("-: ") for cell in cells):
                current.append(cells)
        else:
            current = None
    return tables


def test_the_benchmarks_page_opens_with_one_headline_table_whose_numbers_are_its_details():
    """The first section is the headline; its one table is the page's first. Each row links to the
    section with its details, and every number in its result is that section's (a number typed by
    hand, or a link to the wrong section, fails here). The rows cover what a reader comes for: the
    CPU against the ports' loop style, each GPU's training and beam search, the Flickr8k recipes."""
    text = (DOCS / "benchmarks.md").read_text()
    first = [name for _, name, level in _headings(text) if level == 2][0]
    assert first == "headline"
    headline = _section(text, "headline")
    assert len(_tables(headline)) == 1 and _tables(text)[0] == _tables(headline)[0]
    header, *rows = _tables(headline)[0]
    assert header == ["what", "result", "machine, date", "details"]
    anchors = {name for _, name, _ in _headings(text)}
    for what, result, _, details in rows:
        link = re.fullmatch(r"\[[^]]+\]\(#([^)]+)\)", details)
        assert link and link.group(1) in anchors, f"{what}: {details} is no section of the page"
        section = _section(text, link.group(1))
        numbers = NUMBER.findall(result.replace("**", ""))
        assert numbers, what
        for number in numbers:
            assert re.search(rf"(?<![\w.,]){re.escape(number)}(?![\d,]|\.\d)", section), \
                f"{what}: {number} is not in #{link.group(1)}"
    whats = [row[0] for row in rows]
    assert any("port" in what for what in whats) and sum("Flickr8k" in what for what in whats) == 2
    machines = [row[2] for row in rows]
    for gpu in ("H200", "H100"):
        mine = [what for what, machine in zip(whats, machines) if gpu in machine]
        assert any("training" in what for what in mine) and any("beam" in what for what in mine), gpu


def test_the_dated_passages_live_in_the_history_not_in_the_references():
    """A reference states each measurement with its date in its text; the passages that are a date
    (a run that came before, a check that a change cost nothing) are headings of history.md. The
    GPU runs are the one exception: each GPU is measured once, on its date."""
    for page in ("benchmarks.md", "testing.md"):
        text = (DOCS / page).read_text()
        dated = [text.splitlines()[index] for index, name, _ in _headings(text) if DATE.search(name)]
        assert all(line.startswith("### Measured: one ") for line in dated), f"{page}: {dated}"
    history = (DOCS / "history.md").read_text()
    assert sum(bool(DATE.search(name)) for _, name, _ in _headings(history)) >= 10


def test_the_testing_page_is_short_and_its_mutation_scores_are_one_table():
    """docs/testing.md is for a contributor (the layout, the skip policy, how to run the suite and
    mutmut) in at most 300 lines; the mutation runs are one table of module, score and date, each
    score its killed mutants over those tried."""
    text = (DOCS / "testing.md").read_text()
    assert len(text.splitlines()) <= 300
    mutation = _section(text, "mutation-testing")
    assert len(_tables(mutation)) == 1
    header, *rows = _tables(mutation)[0]
    assert header == ["module", "score", "date"] and len(rows) >= 12
    for module, score, date in rows:
        assert module.startswith("`captioning/") and DATE.fullmatch(date), module
        percent, killed, tried = re.fullmatch(r"([\d.]+)% \((\d+) of (\d+)\)", score).groups()
        assert float(percent) == round(100 * int(killed) / int(tried), 1), module
    for command in ("make mutate", "mutmut results", "mutmut show", "--allowed-skips", "make test-fast"):
        assert command in text


def _links(page: Path) -> list[tuple[Path, str]]:
    """(the file, the anchor or '') of each relative link of a markdown page."""
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        found.append(((page.parent / path).resolve() if path else page, anchor))
    return found


def test_every_link_into_or_out_of_the_reference_pages_lands():
    """The pages that link to a benchmark's or a test's details (and the details' own links) land on
    a file that is there and a heading it has, so that moving a passage to the history moves its
    links too."""
    pages = [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((REPO / "studies").rglob("README.md"))]
    checked = 0
    for page in pages:
        for target, anchor in _links(page):
            if page.name not in PAGES and (target.parent != DOCS or target.name not in PAGES):
                continue
            assert target.exists(), f"{page.relative_to(REPO)}: {target} is not there"
            if anchor and target.suffix == ".md":
                anchors = {name for _, name, _ in _headings(target.read_text())}
                assert anchor in anchors, f"{page.relative_to(REPO)}: {target.name}#{anchor} is no heading"
            checked += 1
    assert checked > 30


FOLDERS = sorted(path.name for path in (REPO / "captioning").iterdir() if (path / "__init__.py").exists())
# Named as they were: testing.md's table keeps the mutation score of the module before it was split.
GONE = {"testing.md: captioning/cli.py"}


def _named(text: str) -> set[str]:
    """The package's names a page gives in code spans: `captioning.x.y.Name`, and `captioning/x/y.py`
    or `x/y.py` where x is one of the package's folders."""
    spans = re.findall(r"`([^`\n]+)`", text)
    dotted = {match for span in spans for match in re.findall(r"\bcaptioning(?:\.\w+)+", span)}
    paths = {"captioning/" + match.removeprefix("captioning/") for span in spans for match in re.findall(
        rf"(?<![\w/.])(?:captioning/)?(?:{'|'.join(FOLDERS)})/[\w/]+\.py\b", span)}
    return dotted | paths


def _resolves(name: str) -> bool:
    """A path is a file; a dotted name is a module, or an attribute of the longest module it starts with."""
    import importlib

    if "/" in name:
        return (REPO / name).is_file()
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_name_of_the_package_a_page_gives_is_there():
    """A module, class or function the README and docs name (not docs/history.md, which tells what
    was): a rename that leaves a page pointing at nothing fails here."""
    pages = [REPO / "README.md", *sorted(path for path in DOCS.glob("*.md") if path.name != "history.md")]
    missing = [f"{page.name}: {name}" for page in pages for name in sorted(_named(page.read_text()))
               if not _resolves(name) and f"{page.name}: {name}" not in GONE]
    named = sum(len(_named(page.read_text())) for page in pages)
    assert named > 60 and missing == [], missing  # 81 when written: the pattern still finds them
