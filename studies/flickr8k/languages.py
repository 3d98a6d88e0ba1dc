"""Captions in a second language beside English: the English captions of exactly the photos the
German file describes, so that the English recipe trains and is scored on the same photos.

Multi30k's German descriptions cover 5 528 of Flickr8k's 6 000 train photos and 934 of its 1 000
val photos. The English captions come from Karpathy's split file (dataset_flickr8k.json, whose
sentences are Flickr8k.token.txt's), written in Flickr8k's token format under the study's cache
folder (never into the data folder, which is only read): data.token_file then reads them as it
reads the German file.
"""

from __future__ import annotations

import json
from pathlib import Path

GERMAN = "Flickr8k.de.token.txt"


def same_photos_english(data: Path, path: Path) -> Path:
    """Write `path` once: `<file>#<i><TAB><caption>` for each English caption of a photo that has a
    German one (DATA/Flickr8k.de.token.txt), from DATA/dataset_flickr8k.json."""
    if path.exists():
        return path
    described = {line.split("#", 1)[0] for line in (data / GERMAN).read_text(encoding="utf-8").splitlines()
                 if line.strip()}
    entries = json.loads((data / "dataset_flickr8k.json").read_text())["images"]
    lines = [f"{entry['filename']}#{i}\t{sentence['raw']}" for entry in entries if entry["filename"] in described
             for i, sentence in enumerate(entry["sentences"])]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
    temporary.replace(path)
    return path
