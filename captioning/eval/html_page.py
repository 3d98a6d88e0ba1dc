"""One HTML page to browse captions and their attention: every image with its caption, each word a
button that shows its map over the image (hover or focus to look, click to keep it). With
self-attention over the words (model.extras.word_attention), a row of the caption's words under it
shades <start> and each earlier word by the weight the word shown gave it.

The page is self-contained: inline style and script, images by relative path, nothing fetched, so the
overlay folder can be copied, zipped or opened from disk as it is.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from captioning.data.records import counted, name_on_one_line
from captioning.eval.overlays import word_file
from captioning.runtime.files import replace_text


@dataclass
class PageEntry:
    folder: str  # the image's overlay folder, relative to the page
    source: str  # what the image was called (its path as given; shown escaped where it is not one line of text)
    tokens: Sequence[str]
    word_alphas: Sequence[Sequence[float]] | None = None  # [T, T], as captioning.api.Captioned.word_alphas


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; background: #fafafa; color: #222; }
figure { display: inline-block; vertical-align: top; margin: 0 1.5rem 2rem 0; max-width: 480px; }
figure img { max-width: 480px; max-height: 480px; display: block; background: #ddd; }
figcaption { margin-top: .5rem; line-height: 2; }
.source { font-size: .8rem; color: #666; word-break: break-all; }
button.word { font: inherit; border: 1px solid #bbb; border-radius: 4px; background: #fff; padding: 0 .35rem;
              margin: 0 .1rem; cursor: pointer; }
button.word:hover, button.word:focus { border-color: #06c; }
button.word.kept { background: #06c; border-color: #06c; color: #fff; }
button.image { font-style: italic; }
.said { font-size: .85rem; color: #444; }
.said span { padding: 0 .25rem; border-radius: 3px; }
"""

_SCRIPT = """
for (const figure of document.querySelectorAll("figure")) {
  const view = figure.querySelector("img");
  const buttons = figure.querySelectorAll("button.word");
  let kept = figure.querySelector("button.kept");
  const said = figure.querySelectorAll(".said span");
  const show = (button) => {
    view.src = button.dataset.map; view.alt = button.textContent;
    const weights = JSON.parse(button.dataset.said || "[]");  // <start>, then each earlier word
    said.forEach((span, j) => {
      span.style.background = j < weights.length ? `rgba(0, 102, 204, ${weights[j]})` : "transparent";
      span.style.color = j < weights.length && weights[j] > 0.5 ? "#fff" : "";
    });
  };
  for (const button of buttons) {
    button.addEventListener("mouseenter", () => show(button));
    button.addEventListener("focus", () => show(button));
    button.addEventListener("mouseleave", () => show(kept));
    button.addEventListener("click", () => {
      kept.classList.remove("kept"); kept = button; kept.classList.add("kept"); show(kept);
    });
  }
}
"""


def _url(path: str) -> str:
    """A relative path as a link: a folder named `photo #1` or `50%` is a file, not a fragment or an escape."""
    return quote(path, errors="surrogateescape")


def _figure(entry: PageEntry, *, language: str) -> str:
    folder = entry.folder
    weights = entry.word_alphas
    maps = [("image", _url(f"{folder}/image.jpg"), "word image", None)]
    maps += [(token, _url(f"{folder}/{word_file(i, token)}"), "word",
              None if weights is None else [round(float(w), 3) for w in weights[i][:i + 1]])
             for i, token in enumerate(entry.tokens)]
    first = 1 if entry.tokens else 0  # the first word's map is shown at first: the page opens on attention
    def button(i: int, text: str, src: str, kind: str, said: list[float] | None) -> str:
        weighed = "" if said is None else f' data-said="{html.escape(json.dumps(said))}"'
        return (f'<button class="{kind}{" kept" if i == first else ""}" data-map="{html.escape(src)}"{weighed}>'
                f'{html.escape(text)}</button>')

    buttons = " ".join(button(i, *entry) for i, entry in enumerate(maps))
    row = ""
    if weights is not None:  # <start> and the words: what each word shown weighed of those before it
        spans = "".join(f"<span>{html.escape(word)}</span>" for word in ("<start>", *entry.tokens[:-1]))
        row = f'<br><span class="said" title="self-attention over the words said so far">{spans}</span>'
    shown, alt = maps[first][1], maps[first][0]
    source = html.escape(name_on_one_line(entry.source))  # a name with bytes that are not UTF-8, escaped
    return (f'<figure>\n  <img src="{html.escape(shown)}" alt="{html.escape(alt)}" loading="lazy">\n'
            f'  <figcaption lang="{html.escape(language)}"><span class="source">{source}</span><br>{buttons}{row}'
            f'</figcaption>\n'
            f'</figure>')


def write_page(out_dir: str | Path, entries: Sequence[PageEntry], *, title: str = "Captions and attention",
               language: str = "en") -> Path:
    """out_dir/index.html over the overlay folders of `entries` (captioning.eval.overlays.save_overlays),
    written whole: a page already there stays as it was until the new one is complete. The page is in
    English, its captions in `language` (the model's data.language: the browser's hyphenation, fonts
    and screen readers follow it)."""
    out_dir = Path(out_dir)
    figures = "\n".join(_figure(entry, language=language) for entry in entries)
    page = (f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f'<style>{_STYLE}</style>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n'
            f'<p>{counted(len(entries), "image")}. Hover a word to see where the model looked as it said it; click '
            f'it to keep it.</p>\n{figures}\n<script>{_SCRIPT}</script>\n</body>\n</html>\n')
    path = out_dir / "index.html"
    replace_text(path, page)
    return path


# What a folder name cannot hold and still be copied, zipped or linked to from the page: bytes that
# are not UTF-8 (Python's lone surrogates), line breaks and other control characters.
_NOT_IN_A_FOLDER_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def folder_name(source: str) -> str:
    """The overlay folder of the image at `source`: its file name without the suffix, with each
    character a folder name cannot hold (above) as "_"; "image" for a name of dots alone, which would
    name the overlay folder itself or the one above it."""
    stem = _NOT_IN_A_FOLDER_NAME.sub("_", Path(source).stem)
    return stem if stem.strip(".") else "image"


class OverlayFolder:
    """DIR/<image name>/ for each captioned image (captioning.api.Captioned.save_overlays), and
    DIR/index.html over them all when done."""

    def __init__(self, out_dir: str | Path, *, animation: bool = False, language: str = "en"):
        self.out_dir, self.animation, self.language = Path(out_dir), animation, language
        self.entries: list[PageEntry] = []
        self.used: set[str] = set()

    def add(self, result) -> None:
        stem = folder_name(result.source)
        name, copy = stem, 1
        # two photo.jpg from two folders: photo, photo_2; Photo.jpg beside photo.png too, since macOS's and
        # Windows' file systems take the two names for one folder
        while name.casefold() in self.used:
            copy += 1
            name = f"{stem}_{copy}"
        self.used.add(name.casefold())
        result.save_overlays(self.out_dir / name, animation=self.animation)
        self.entries.append(PageEntry(folder=name, source=result.source, tokens=result.tokens,
                                      word_alphas=result.word_alphas))

    def finish(self) -> Path | None:
        """The page, where any image was added (a page already there is kept otherwise)."""
        return write_page(self.out_dir, self.entries, language=self.language) if self.entries else None
