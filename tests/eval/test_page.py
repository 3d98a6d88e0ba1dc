"""The overlay page: valid HTML, every file it names exists beside it, every word has its map."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import numpy as np
from PIL import Image

from captioning.eval.html_page import OverlayFolder, PageEntry, write_page
from captioning.eval.overlays import save_overlays
from tests.tiny import REPO

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
        for source in [figure["img"], *(b["map"] for b in buttons)]:  # links, as a browser reads them
            assert not source.startswith(("/", "http:", "https:", "file:")) and (tmp_path / unquote(source)).is_file()
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


def test_names_people_have_are_on_the_page_escaped_and_linked_to_their_folders(tmp_path: Path) -> None:
    """A source whose bytes are not UTF-8 or that holds a line break is shown escaped, and the page is
    UTF-8; a folder named with `#`, `?` or `%` is linked as a file, not as a fragment, query or escape."""
    folders = ["photo #1", "what?", "100%", "plain"]
    sources = [os.fsdecode(b"photos/bad\xffname.jpg"), "photos/new\nline.jpg", "photos/100%.jpg", "photos/plain.jpg"]
    entries = [_entry(tmp_path, folder, ["a", "dog"], (32, 32)) for folder in folders]
    for entry, source in zip(entries, sources):
        entry.source = source
    page = write_page(tmp_path, entries).read_text(encoding="utf-8")
    reader = _Reader()
    reader.feed(page)
    for figure, folder in zip(reader.figures, folders):
        assert unquote(figure["img"]) == f"{folder}/00_a.jpg" and "#" not in figure["img"] and "?" not in figure["img"]
    assert ('<span class="source">photos/bad\\xffname.jpg</span>' in page
            and '<span class="source">photos/new\\nline.jpg</span>' in page)
    assert "<p>4 images." in page


def test_german_words_are_whole_on_the_page_in_their_files_and_marked_as_german(tmp_path: Path) -> None:
    """Words with umlauts and ß: their buttons say them as they are, their overlay files carry them in
    their names (linked as UTF-8 percent-escapes, as browsers read them), and the captions are marked
    with the model's language while the page around them stays English."""
    words = ["zwei", "mädchen", "laufen", "über", "die", "straße"]
    entry = _entry(tmp_path, "straße", words, (48, 48))
    page = write_page(tmp_path, [entry], language="de").read_text(encoding="utf-8")
    reader = _Reader()
    reader.feed(page)
    buttons = reader.figures[0]["buttons"]
    assert [b["text"] for b in buttons] == ["image", *words]
    assert buttons[2]["map"] == "stra%C3%9Fe/01_m%C3%A4dchen.jpg"
    assert all((tmp_path / unquote(b["map"])).is_file() for b in buttons)
    assert '<html lang="en">' in page and page.count('<figcaption lang="de">') == 1
    assert '<figcaption lang="en">' in write_page(tmp_path, [entry]).read_text(encoding="utf-8")


def test_a_page_of_one_image_says_one_image(tmp_path: Path) -> None:
    page = write_page(tmp_path, [_entry(tmp_path, "scene", ["a"], (16, 16))]).read_text()
    assert "<p>1 image. " in page


def test_overlay_folders_stay_inside_the_folder_asked_for(tmp_path: Path) -> None:
    """An image named `...png` or `..png` has a stem of dots, which as a folder name is the overlay
    folder itself or the one above it; a line break or a byte that is not UTF-8 cannot be in a
    folder name that the page links to and that copies to other systems."""
    out = tmp_path / "overlays"

    def result(source: str) -> types.SimpleNamespace:
        def save(folder: Path, animation: bool = False) -> None:
            folder.mkdir(parents=True)
            (folder / "image.jpg").write_bytes(b"")

        return types.SimpleNamespace(source=source, tokens=[], word_alphas=None, save_overlays=save)

    overlays = OverlayFolder(out)
    for source in ("photos/...png", "photos/..png", os.fsdecode(b"photos/bad\xffname.png"), "photos/new\nline.png",
                   "photos/photo.png", "photos/Photo.jpg"):  # one folder on a file system blind to case
        overlays.add(result(source))
    assert overlays.finish() == out / "index.html"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["overlays"]
    assert sorted(p.name for p in out.iterdir()) == ["Photo_2", "bad_name", "image", "image_2", "index.html",
                                                     "new_line", "photo"]


def test_a_page_that_cannot_be_written_whole_leaves_the_one_there_as_it_was(tmp_path: Path) -> None:
    """A disk that fills while the page is written (here a file size limit of 1 000 bytes, in a
    process of its own) leaves the page of an earlier run whole, and no temporary file beside it."""
    entries = [_entry(tmp_path, f"scene{i}", ["a", "red", "circle"], (16, 16)) for i in range(3)]
    (tmp_path / "index.html").write_text("the page of an earlier run")
    before = sorted(p.name for p in tmp_path.iterdir())
    script = ("import resource, signal, sys\n"
              "from captioning.eval.html_page import PageEntry, write_page\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, as on a full disk\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
              f"write_page(sys.argv[1], [PageEntry(folder=f, source=f + '.jpg', tokens=['a', 'red', 'circle']) "
              f"for f in {[entry.folder for entry in entries]!r}])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "File too large" in done.stderr, done.stderr
    assert (tmp_path / "index.html").read_text() == "the page of an earlier run"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
