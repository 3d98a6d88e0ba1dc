"""Progress bars for long work (training epochs, decoding a split, caching features, reading
captions, captioning a folder): tqdm on stderr, shown where stderr is a terminal and off elsewhere
(CI logs, files), and off everywhere with --quiet.

--quiet sets CAPTIONING_QUIET=1 in the environment, so that the processes torchrun or a DataLoader
starts inherit it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

QUIET = "CAPTIONING_QUIET"


def quiet() -> None:
    """No progress bars from here on, in this process and the ones it starts."""
    os.environ[QUIET] = "1"


def bar(iterable: Iterable | None = None, *, show: bool | None = None, **options: Any) -> tqdm:
    """A tqdm bar on stderr. `show`: None draws it where stderr is a terminal; True or False decide
    (a command that knows its work is long may show it in a log); --quiet wins over both."""
    disable = True if os.environ.get(QUIET) == "1" else (None if show is None else not show)
    return tqdm(iterable, disable=disable, dynamic_ncols=True, **options)
