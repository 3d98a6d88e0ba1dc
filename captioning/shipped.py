"""The models that ship inside the package, and a checkpoint cut for shipping (`for_captioning`):
what captioning reads and nothing to resume, one decoder or several in one file, with no place on
the machine that trained it. A checkpoint itself is written, read and built again by
captioning.checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captioning.checkpoint import CheckpointError, weights_digest

# The models that ship inside the package (decoder and vocabulary; the encoder's weights come from
# their own package): name -> file under captioning/pretrained/. Each file's record says what made it.
PRETRAINED = {"flickr8k": "flickr8k_soft.pt"}


def pretrained_path(name: str = "flickr8k") -> Path:
    """The file of a model that ships inside the package (PRETRAINED), checked to be there."""
    if name not in PRETRAINED:
        raise CheckpointError(f"no shipped model named '{name}' (shipped: {', '.join(PRETRAINED)})")
    path = Path(__file__).parent / "pretrained" / PRETRAINED[name]
    if not path.is_file():
        raise CheckpointError(f"{path}: the shipped {name} model is missing from this installation; reinstall "
                              "the package, or pass --checkpoint")
    return path


def for_captioning(payload: dict[str, Any], *, release: dict[str, Any] | None = None,
                   members: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """A checkpoint cut down to what captioning reads (config, vocabulary, grid, the decoder's
    weights in fp16, its record), as the shipped model is: no optimizer state, nothing to resume;
    about a quarter of a best.pt. `release` (the numbers, the command that made it, the licence)
    is kept beside the record. The decoder computes in fp32; fp16 storage rounds each weight to
    about 3 significant digits, so the exported model's captions are those of its own file.

    `members`: other checkpoints whose decoders caption together with this one, as one ensemble in
    one file (each cut the same way, under "members"). They must read the same annotations and say
    the same words, as load_ensemble checks: the caller loads them together first."""
    for part in (payload, *members):
        if "encoder" in part:
            raise CheckpointError("a fine-tuned encoder's weights are the checkpoint's own: export keeps the "
                                  "decoder only, for a frozen encoder rebuilt from its package")
    slim = {**_cut(payload), **{key: payload[key] for key in ("vocab", "grid", "annotation_dim") if key in payload}}
    if members:
        slim["members"] = [_cut(member) for member in members]
        if "record" in slim:  # every decoder's digest, in order (verify compares them)
            slim["record"]["weights"]["members"] = [weights_digest(m["decoder"]) for m in slim["members"]]
    if release is not None:
        slim["release"] = release
    return slim


def _cut(payload: dict[str, Any]) -> dict[str, Any]:
    """One decoder as it is shipped: its config (no machine's paths), fp16 weights, record, progress."""
    cut: dict[str, Any] = {"config": without_machine_paths(payload["config"]),
                           "decoder": {name: value.half() if value.is_floating_point() else value
                                       for name, value in payload["decoder"].items()}}
    progress = payload.get("progress", {})  # where its run stood, its validations included (inspect shows them)
    cut["progress"] = {key: progress[key] for key in ("step", "epoch", "best_metric", "seconds", "history")
                       if key in progress}
    if "record" in payload:  # the digest of the weights it holds (verify compares them), the fp16 ones
        cut["record"] = {**payload["record"], "weights": {"decoder": weights_digest(cut["decoder"])}}
    return cut


def without_machine_paths(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's config (plain data) with no place on the machine that trained it: data.root as
    the configs name it (data/DATASET: eval.py's data.root=DIR says where it is here), no cache root
    (one from the config would take the caches there even with data.root=DIR given), the run's folder
    by its name, no warm start, the encoder's weights file by its name."""
    config = copy.deepcopy(config)
    data, train, encoder = (config.setdefault(section, {}) for section in ("data", "train", "encoder"))
    data["root"] = f"data/{data.get('dataset', 'shapes')}"
    data["cache_root"] = None
    if train.get("out_dir"):
        train["out_dir"] = f"runs/{Path(train['out_dir']).name}"
    train["init_from"] = None
    if encoder.get("weights_path"):
        encoder["weights_path"] = Path(encoder["weights_path"]).name
    return config
