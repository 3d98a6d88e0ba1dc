"""Pickling the feature cache by reference: a read-only memory map travels as its file's name.

A DataLoader started with the spawn or forkserver method (the default on macOS and Windows, and
what CUDA needs) pickles its dataset into every worker. A pickled np.memmap carries its whole
contents, tens of GB for COCO's cache, once per worker and per epoch. A memory map that covers a
whole .npy file (np.load(path, mmap_mode="r"), captioning.data.features) is fully described by
the file's name, the data's offset in it, its shape, dtype and order, so datasets that hold one
pickle that description instead (`MappedFile`, a few hundred bytes) and the worker maps the same
file again, read-only: the pages are the operating system's page cache, shared by every process.

Anything else (an array in memory, or a view into a map, which the file alone does not describe)
pickles as it always did.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MappedFile:
    """Where a read-only memory-mapped array lives; unpickling it maps the file again (np.memmap)."""

    filename: str
    offset: int  # bytes before the data: the .npy header
    shape: tuple[int, ...]
    dtype: np.dtype
    order: str  # "C" or "F"

    @classmethod
    def of(cls, array: Any) -> MappedFile | None:
        """The file behind `array` if it is a read-only memory map of a whole file; None otherwise.

        Only a map made from the file (its base is the mmap itself) covers the file from `offset` to
        the end; a slice or any other view of it has the map as its base and is not described by it.
        """
        if not (isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap)):
            return None
        if array.mode != "r" or array.filename is None:  # "r+"/"w+": being written; "c": private changes
            return None
        order = "C" if array.flags.c_contiguous else "F"
        return cls(str(array.filename), int(array.offset), tuple(array.shape), array.dtype, order)

    def __reduce__(self) -> tuple:
        # Unpickled, the description becomes the map itself: the dataset gets back the array type it had.
        return np.memmap, (self.filename, self.dtype, "r", self.offset, self.shape, self.order)


def by_reference(state: dict[str, Any]) -> dict[str, Any]:
    """An object's attributes for pickling (`__getstate__`), each read-only memory map of a whole
    file replaced by its MappedFile: a copy of the dict, the object itself is left as it is."""
    return {name: MappedFile.of(value) or value for name, value in state.items()}
