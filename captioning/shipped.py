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
from captioning.config.choices import stage_names
from captioning.runtime.files import float_weights, int8_weights

# The models that ship inside the package (decoder and vocabulary; the encoder's weights come from
# their own package): name -> file under captioning/pretrained/. Each file's record says what made it.
# The first is the default: English.
PRETRAINED = {"flickr8k": "flickr8k_soft.pt", "flickr8k_de": "flickr8k_de_soft.pt"}


def pretrained_path(name: str | None = None) -> Path:
    """The file of a model that ships inside the package (PRETRAINED; None: the first, English),
    checked to be there."""
    name = next(iter(PRETRAINED)) if name is None else name
    if name not in PRETRAINED:
        raise CheckpointError(f"no shipped model named '{name}' (shipped: {', '.join(PRETRAINED)})")
    path = Path(__file__).parent / "pretrained" / PRETRAINED[name]
    if not path.is_file():
        raise CheckpointError(f"{path}: the shipped {name} model is missing from this installation; reinstall "
                              "the package, or pass --checkpoint")
    return path


def for_captioning(payload: dict[str, Any], *, release: dict[str, Any] | None = None,
                   members: Sequence[dict[str, Any]] = (), precision: str = "fp16") -> dict[str, Any]:
    """A checkpoint cut down to what captioning reads (config, vocabulary, grid, the decoder's
    weights, a fine-tuned encoder's own stages, its record), as the shipped model is: no optimizer
    state, nothing to resume; about a quarter of a best.pt. `release` (the numbers, the command that
    made it, the licence) is kept beside the record.

    `precision`: how the weights are stored; they are computed in fp32 either way, so the exported
    model's captions are those of its own file. "fp16" rounds each weight to about 3 significant
    digits; "int8" stores matrices and kernels as int8 codes with a scale per 32 numbers
    (captioning.runtime.files.int8_weights), half the size again, for an ensemble that would not fit
    otherwise.

    `members`: other checkpoints whose decoders caption together with this one, as one ensemble in
    one file (each cut the same way, under "members"; a fine-tuned member keeps its encoder's
    stages). They must see the same pixels and say the same words, as load_ensemble checks: the
    caller loads them together first."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision '{precision}': one of {', '.join(PRECISIONS)}")
    slim = {**_cut(payload, precision),
            **{key: payload[key] for key in ("vocab", "grid", "annotation_dim") if key in payload}}
    if members:
        # each member's annotation width is its own: a member over another encoder reads other channels
        slim["members"] = [{**_cut(member, precision),
                            **({"annotation_dim": member["annotation_dim"]} if "annotation_dim" in member else {})}
                           for member in members]
        if "record" in slim:  # every decoder's digest, in order (verify compares them)
            slim["record"]["weights"]["members"] = [weights_digest(m["decoder"]) for m in slim["members"]]
            if any("encoder" in m for m in slim["members"]):
                slim["record"]["weights"]["member_encoders"] = [
                    weights_digest(m["encoder"]) if "encoder" in m else None for m in slim["members"]]
    if release is not None:
        slim["release"] = release
    return slim


PRECISIONS = ("fp16", "int8")


def _stored(state: dict[str, Any], precision: str) -> dict[str, Any]:
    """Weights as `precision` stores them, from weights as a checkpoint holds them (a shipped file's
    int8 codes read back first, so that a file cut again from itself keeps its numbers)."""
    state = float_weights(state)
    if precision == "int8":
        return int8_weights(state)
    return {name: value.half() if value.is_floating_point() else value for name, value in state.items()}


def tuned_stages(state: dict[str, Any], encoder: dict[str, Any]) -> dict[str, Any]:
    """A fine-tuned encoder's weights, cut to the stages that fine-tuned (encoder.fine_tune_from and
    those after it): the frozen ones before are the pretrained weights its package ships."""
    first = encoder.get("fine_tune_from")
    stages = stage_names(encoder.get("name", ""), encoder.get("layer", ""))
    if first is None or first not in stages:
        return state
    tuned = tuple(f"body.{stage}." for stage in stages[stages.index(first):])
    return {name: value for name, value in state.items() if name.startswith(tuned)}


def _cut(payload: dict[str, Any], precision: str) -> dict[str, Any]:
    """One decoder as it is shipped: its config (no machine's paths), its weights as `precision`
    stores them (and a fine-tuned encoder's own stages), record, progress."""
    cut: dict[str, Any] = {"config": without_machine_paths(payload["config"]),
                           "decoder": _stored(payload["decoder"], precision)}
    if isinstance(payload.get("encoder"), dict):
        cut["encoder"] = _stored(tuned_stages(payload["encoder"], payload["config"].get("encoder", {})), precision)
    progress = payload.get("progress", {})  # where its run stood, its validations included (inspect shows them)
    cut["progress"] = {key: progress[key] for key in ("step", "epoch", "best_metric", "seconds", "history")
                       if key in progress}
    if "record" in payload:  # the digests of the weights it holds (verify compares them), as stored
        weights = {"decoder": weights_digest(cut["decoder"])}
        if "encoder" in cut:
            weights["encoder"] = weights_digest(cut["encoder"])
        cut["record"] = {**payload["record"], "weights": weights}
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
