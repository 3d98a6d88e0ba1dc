"""How the package writes files: each replaced whole, under a temporary name of its own, so that a
reader never sees half of one (`replace_text`); and how a checkpoint's weights are
stored: as they are (fp32, fp16), or below fp16 as int8 codes with scales, which a module cannot load
as they are (float_weights reads them back). A shipped file stores its weights so when fp16 would not
fit (captioning.shipped.for_captioning(..., precision=)).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any

import torch

# Weights stored below fp16 (shipped.for_captioning(..., precision="int8")): each tensor of two or
# more dimensions as int8 codes, in groups of INT8_GROUP numbers along its rows (a whole row where
# they do not divide it), each group with an fp16 scale, max |w| / 127, under NAME + SCALE. Read back
# here as float32: a weight moves by at most half its group's scale.
SCALE, INT8_GROUP = ":scale", 32


def int8_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict as int8 codes and their scales (matrices and kernels), the rest in fp16."""
    stored = {}
    for name, value in state.items():
        if not value.is_floating_point() or value.dim() < 2:
            stored[name] = value.half() if value.is_floating_point() else value
            continue
        rows = value.detach().float().reshape(value.shape[0], -1)  # [R, C]
        group = INT8_GROUP if rows.shape[1] % INT8_GROUP == 0 else rows.shape[1]
        groups = rows.reshape(rows.shape[0], -1, group)  # [R, C / group, group]
        largest = groups.abs().amax(dim=2)  # [R, C / group]
        scale = (largest / 127).clamp_min(1e-7).half()  # as stored
        # Below fp16's normal range (a group whose largest weight is under 1e-2) rounding may take the
        # scale down by up to a third: the largest weight's code would clip at 127 and move it by more
        # than half a step. The next fp16 up keeps every weight within half its group's scale.
        short = scale.float() * 127 < largest
        scale = torch.where(short, torch.nextafter(scale, torch.full_like(scale, torch.inf)), scale)
        codes = torch.round(groups / scale.float()[..., None]).clamp(-127, 127)  # [R, C / group, group]
        stored[name] = codes.to(torch.int8).reshape(value.shape)
        stored[name + SCALE] = scale
    return stored


def float_weights(state: dict[str, Any]) -> dict[str, Any]:
    """A state dict as stored (fp32, fp16, or int8 codes with their scales) -> what a module loads:
    int8 codes times their group's scale; every other tensor as it is (load_state_dict widens fp16)."""
    weights = {}
    for name, value in state.items():
        if name.endswith(SCALE):
            continue
        scale = state.get(name + SCALE)
        if scale is None:
            weights[name] = value
            continue
        groups = value.float().reshape(*scale.shape, -1)  # [R, C / group, group]
        weights[name] = (groups * scale.float()[..., None]).reshape(value.shape)
    return weights


# files replaced whole -----------------------------------------------------------------------------
# Files replaced whole: written beside their final name under a name of their own, then renamed.
#
# A reader never sees half a file and a kill never leaves one. The temporary's name is unique to the
# write, because two processes may write the same file at once (two runs sharing one feature cache,
# ranks writing a dataset's split record): with one shared temporary name, the first rename took the
# other's file away mid-write and the second process failed. Each now renames its own whole file; the
# last rename wins, and both wrote the same thing.

def temporary_beside(path: Path) -> Path:
    """A fresh hidden name in `path`'s folder, for this one write."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


# A rename alone may reach the disk before the data it names: a power cut or a machine crash soon after
# could leave an empty file under the real name, where a kill leaves the old one or the new one whole.
# So a file written whole is synced (`sync`, before it is closed) and then renamed (`replace_on_disk`,
# after: Windows renames no file that is open), its folder synced after the rename.

def sync(file: Any) -> None:
    """An open file's bytes on the disk."""
    file.flush()
    os.fsync(file.fileno())


def replace_on_disk(temporary: Path, path: Path) -> None:
    """Rename the synced, closed `temporary` to `path`, and the rename onto the disk before this returns."""
    os.replace(temporary, path)
    with contextlib.suppress(OSError):  # a folder cannot be opened to sync on every system (Windows)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` whole, readable by whoever the umask lets read (a tempfile-module file
    would be its owner's alone: other users of a shared cache could not read it). An OSError
    (a read-only folder, a full disk) leaves `path` as it was and no temporary behind."""
    temporary = temporary_beside(path)
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(descriptor, "w", newline="", encoding="utf-8") as file:
            file.write(text)
            sync(file)
        replace_on_disk(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise
