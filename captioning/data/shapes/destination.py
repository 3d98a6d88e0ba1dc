"""Where the shapes generator may write: a missing or empty folder, or one that holds only what the
generator itself writes there (a dataset it made, or was making when it was stopped, which it then
completes) and the caches the project keeps beside its data. Never a folder with anything else in it:
`data.root=MY_PHOTOS` under the embedded default must not fill someone's photo folder with scenes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from captioning.data.records import DatasetError

# What the project keeps in a data folder of its own accord (where data.cache_root is not set): the
# feature caches (captioning/data/features.py), the tokenized captions (captioning/data/tokenized.py)
# and a folder dataset's kept splits (captioning/data/kept_splits.py), each a folder of that name.
_CACHES = r"(features|tokens|splits)(/.*)?"

# Every path (relative, with /) the generator writes, the folders on the way included, as scenes.py
# names them: make_shapes' dataset, and write_folder's folder of photos.
DATASET = re.compile(rf"images(/(?P<split>train|val|test)(/(?P=split)_\d{{5,}}\.png)?)?|captions_(train|val|test)\.json"
                     rf"|dataset_shapes\.json|objects\.json|{_CACHES}")
PHOTOS = re.compile(rf"images(/scene_\d{{5,}}\.jpg)?|captions\.csv|{_CACHES}")

_NAMED = 3  # the foreign entries a message names (then how many more)


def foreign_entries(folder: Path, own: re.Pattern[str]) -> list[str]:
    """The paths under `folder` (relative, sorted) that are not the generator's `own`: none in a
    missing folder; a folder among them ends in /. A link is never its own (the generator makes none,
    and would write through it).
    A folder that cannot be looked into, or a file where the folder would be, is DatasetError."""
    if not folder.exists():
        return []
    if not folder.is_dir():
        raise DatasetError(f"{folder}: is a file, not a folder; nothing written")
    foreign = []
    try:
        for parent, folders, files in os.walk(folder, onerror=_raise):
            here = Path(parent).relative_to(folder)
            for name in [*folders, *files]:
                path = here / name
                if (folder / path).is_symlink() or not own.fullmatch(path.as_posix()):
                    foreign.append(path.as_posix() + ("/" if name in folders else ""))
            folders[:] = [name for name in folders if f"{(here / name).as_posix()}/" not in foreign]  # named already
    except OSError as error:
        raise DatasetError(f"{folder}: cannot look into it ({error.strerror or error}); nothing written") from error
    return sorted(foreign)


def _raise(error: OSError) -> None:
    raise error


def listed(entries: list[str]) -> str:
    """'a.jpg, b.jpg, c.jpg and 4 more'."""
    more = f" and {len(entries) - _NAMED} more" if len(entries) > _NAMED else ""
    return f"{', '.join(entries[:_NAMED])}{more}"


def refuse_foreign(folder: Path, own: re.Pattern[str], *, what: str) -> None:
    """DatasetError, one line naming `folder` and the first of what is in it, where `folder` holds
    anything that is not the generator's `own` (`what`: the data it would make, for the message)."""
    if foreign := foreign_entries(folder, own):
        raise DatasetError(f"{folder}: holds files that are not {what} ({listed(foreign)}); nothing written: "
                           "the shapes generator writes only into a new or empty folder, or one it wrote before")
