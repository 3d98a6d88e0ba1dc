"""A new run from a trained model's weights (train.init_from), not a resumed one.

`--resume` continues the same run exactly: optimizer, schedule, step, random state. A warm start
takes only what the model learned, the decoder's weights (and the encoder's where it was
fine-tuned) and the vocabulary those weights index, and starts everything else afresh: the usual
second stage after training on cached features is fine-tuning the encoder's last block at a lower
rate from the first stage's best.pt (configs/coco_vgg19_finetune.yaml), or training the same model
on another objective.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from captioning.checkpoint import CheckpointError, config_of
from captioning.config import Config
from captioning.data.prepare import vocabulary_path
from captioning.data.vocab import Vocabulary
from captioning.runtime.files import float_weights


def warm_vocabulary(config: Config, source: dict[str, Any], path: str | Path) -> list[str]:
    """The checkpoint's vocabulary, which its weights index; a different one already prepared for
    this run is an error rather than a silent mismatch of word ids."""
    config_of(source, path)  # one of ours, with what a warm start needs
    prepared = vocabulary_path(config)
    if prepared.exists():
        words = Vocabulary.load(prepared).words
        if words != list(source["vocab"]):
            raise CheckpointError(f"{path}: its vocabulary ({len(source['vocab'])} words) is not {prepared} "
                                  f"({len(words)} words); a warm start keeps the checkpoint's: remove {prepared} "
                                  "or use another train.out_dir")
    return list(source["vocab"])


def model_differences(config: Config, source: dict[str, Any], path: str | Path, *,
                      settings: Sequence[str] = ("model",), leaving_out: Collection[str] = ()) -> list[str]:
    """The settings of this run that differ from the checkpoint's, as "key: theirs -> ours": those
    under `settings` (sections or keys; a warm start's, the model section), less `leaving_out`.
    A warm start's weights load either way where the shapes agree (dropout, attention kind, the hard
    coin), but a warm start that samples or trains under other settings than its start's trains
    another model: self-critical training sampled with dropout 0.5 from a model trained with 0.3
    moved nothing where 0.3 gained (studies/flickr8k, "Self-critical training"). A resumed run may
    change none of its model's (captioning.train.resume)."""

    def leaves(values: dict[str, Any], prefix: str) -> dict[str, Any]:
        flat: dict[str, Any] = {}
        for key, value in values.items():
            name = f"{prefix}.{key}" if prefix else key
            flat.update(leaves(value, name) if isinstance(value, dict) else {name: value})
        return flat

    def compared(key: str) -> bool:
        return key not in leaving_out and any(key == setting or key.startswith(f"{setting}.") for setting in settings)

    before, now = leaves(config_of(source, path).to_dict(), ""), leaves(config.to_dict(), "")
    return [f"{key}: {before[key]!r} -> {now[key]!r}" for key in now
            if compared(key) and key in before and before[key] != now[key]]


def refuse_what_no_warm_start_takes(source: dict[str, Any], path: str | Path, *, fine_tunes: bool) -> None:
    """What no run could start from, said before any data is read or cached (Run.start asks first):
    a file of several decoders, and a fine-tuned encoder for a run that fine-tunes none (its
    checkpoints keep no encoder, so its decoder would be captioned over the pretrained one, not the
    one it trained over)."""
    if source.get("members"):
        raise CheckpointError(f"{path}: holds {len(source['members']) + 1} decoders that caption together; a warm "
                              "start takes one model's weights: give one of the checkpoints it was cut from")
    if "encoder" in source and not fine_tunes:
        raise CheckpointError(f"{path}: its encoder was fine-tuned, but this run fine-tunes none (it reads the "
                              "pretrained encoder's annotations); set encoder.fine_tune_from to go on fine-tuning it")


def warm_start(model: Any, source: dict[str, Any], path: str | Path, *, config: Config | None = None,
               say: bool = False) -> None:
    """Load the checkpoint's weights into a run's freshly built model (captioning.train.build.RunModel),
    once refuse_what_no_warm_start_takes let it through (Run.start asks before the data);
    with `say`, one line naming the model settings of `config` that differ from the checkpoint's."""
    differences = model_differences(config, source, path) if config is not None else []
    if differences and say:
        print(f"note: train.init_from={path}: this run's model settings differ from the checkpoint's "
              f"({'; '.join(differences)}); it trains with this run's", file=sys.stderr)
    decoder = float_weights(source["decoder"])  # a file cut for shipping stores fp16, or int8 codes and scales
    try:
        model.decoder.load_state_dict(decoder)  # the validated weights (the average, under ema_decay)
        if "encoder" in source:
            # a file cut for shipping holds its fine-tuned stages alone: the frozen ones before them
            # are the pretrained weights this run's encoder was built with
            model.encoder.load_state_dict({**model.encoder.state_dict(), **float_weights(source["encoder"])})
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).strip().splitlines()]
        first = next((line for line in lines[1:] if line), lines[0])  # torch's first line names no tensor
        raise CheckpointError(f"{path}: its weights do not fit this run's model ({first.rstrip('.')}); the model "
                              "section and the encoder must be those the checkpoint was trained with") from error
    if model.average is not None:
        model.average.load_state_dict(decoder)  # the average starts where the weights do
