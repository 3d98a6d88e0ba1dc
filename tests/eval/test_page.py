"""The overlay page: valid HTML, every file it names exists beside it, every word has its map."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import numpy as np
from PIL import Image

from captioning.eval.overlays import save_overlays
from captioning.eval.page import PageEntry, write_page

VOID = {"meta", "img", "br", "link", "input"}


class _Reader(HTMLParser):
    """Collects the figures' images and buttons, and checks that every tag closes in order."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.figures: list[dict] = []
        self.in_button = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "figure":
            self.figures.append({"img": None, "buttons": []})
        elif tag == "img":
            self.figures[-1]["img"] = attributes["src"]
        elif tag == "button":
            self.figures[-1]["buttons"].append({"map": attributes["data-map"], "kept": "kept" in attributes["class"],
                                                "text": ""})
            self.in_button = True
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()
        self.in_button = self.in_button and tag != "button"

    def handle_data(self, data: str) -> None:
        if self.in_button:
            self.figures[-1]["buttons"][-1]["text"] += data


def _entry(out: Path, name: str, tokens: list[str], size: tuple[int, int]) -> PageEntry:
    image = Image.new("RGB", size, (30, 120, 60))
    alphas = np.random.default_rng(0).dirichlet(np.ones(16), size=len(tokens)).reshape(len(tokens), 4, 4)
    save_overlays(image, tokens, alphas, out / name)
    return PageEntry(folder=name, source=f"photos/{name}.jpg", tokens=tokens)


def test_the_page_parses_and_every_file_it_names_exists(tmp_path: Path) -> None:
    entries = [_entry(tmp_path, "scene", ["a", "red", "<unk>", "circle"], (64, 48)),
               _entry(tmp_path, "empty", [], (20, 30)),
               _entry(tmp_path, 'quote"s & <b>', ["it's", "&"], (30, 30))]
    page = write_page(tmp_path, entries)
    reader = _Reader()
    reader.feed(page.read_text(encoding="utf-8"))
    reader.close()
    assert reader.open == []
    assert len(reader.figures) == 3
    for figure, entry in zip(reader.figures, entries):
        buttons = figure["buttons"]
        assert [b["text"] for b in buttons] == ["image", *entry.tokens]
        for source in [figure["img"], *(b["map"] for b in buttons)]:
            assert not source.startswith(("/", "http:", "https:", "file:")) and (tmp_path / source).is_file()
        kept = [b for b in buttons if b["kept"]]
        assert len(kept) == 1 and figure["img"] == kept[0]["map"]  # the page opens on what is marked kept
        assert kept[0]["text"] == (entry.tokens[0] if entry.tokens else "image")
    assert "http" not in page.read_text()  # nothing fetched


def test_the_page_shows_each_words_own_map(tmp_path: Path) -> None:
    """Button k names word k's overlay file, whose pixels differ from the others' (not one map for all)."""
    entry = _entry(tmp_path, "scene", ["a", "b", "c"], (64, 64))
    reader = _Reader()
    reader.feed(write_page(tmp_path, [entry]).read_text())
    maps = [b["map"] for b in reader.figures[0]["buttons"][1:]]
    assert maps == ["scene/00_a.jpg", "scene/01_b.jpg", "scene/02_c.jpg"]
    pictures = [np.asarray(Image.open(tmp_path / m)) for m in maps]
    assert not np.array_equal(pictures[0], pictures[1]) and not np.array_equal(pictures[1], pictures[2])
