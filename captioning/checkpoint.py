"""Checkpoints: state dicts plus plain data, written atomically, read without unpickling code.

A checkpoint holds everything needed to caption (config, vocabulary, decoder weights, grid) and to
resume training exactly (optimizer, scheduler, gradient scaler, step, position in the epoch, RNG
states, the best metric so far). A frozen encoder is not stored: its weights are rebuilt from the
config; a fine-tuned one is. Under train.ema_decay "decoder" is the weights' moving average, the
model that was validated and that captions, and "training_decoder" the weights training goes on from.

A file may hold several decoders that caption together as one ensemble (the mean of their word
probabilities, model/ensemble.py), cut into it by `shipped.for_captioning(..., members=...)`: "decoder"
is the first, "members" the others, each with its own config and record. `load_trained` reads it as
one model. Weights stored below fp16 are read back through captioning.runtime.files; what a checkpoint
holds, as `captioning inspect` prints it, is captioning.inspection.

Format 2 gave the config its sections and the decoder its seams. A format-1 checkpoint is migrated
as it is read (`migrate_v1`): its config's flat keys move to their sections (captioning.config.RENAMED),
and the decoder's parameters that moved get their new names; the numbers are untouched.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from captioning.config import Config, ConfigError, EncoderConfig, apply_overrides, from_dict, migrate, validate
from captioning.data.encoded_images import EncodedImages
from captioning.data.splits import Split, load_splits
from captioning.data.vocab import Vocabulary
from captioning.model.encoder import Encoder, normalization
from captioning.model.encoder_decoder import EncoderDecoder, build_decoder
from captioning.model.ensemble import Ensemble, JoinedEncoder
from captioning.model.paper import AttentionDecoder
from captioning.runtime.files import float_weights, replace_on_disk, sync

FORMAT_VERSION = 2

# What a checkpoint's model is, beside its weights: the model section, the encoder that makes its
# annotations, the image size it sees. A resumed run may change none of it (captioning.train.resume),
# nor may an evaluation, which scores the model the checkpoint holds (captioning.eval.evaluate).
TRAINED_MODEL = ("model", "encoder.name", "encoder.layer", "encoder.padding", "encoder.fine_tune_from",
                 "data.image_size")
# How the model computes, not what it is: model.fused runs the same equations fused or step by step,
# and model.fused=false is the way out that a fast path disagreeing with the step-by-step decoder names.
HOW_IT_COMPUTES = ("model.fused",)


class CheckpointError(ValueError):
    """A checkpoint file that is missing, unreadable or not one of ours; the message names it."""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write to a temporary file in the same folder, then rename (runtime.files.replace_on_disk): a
    kill, a full disk or a power cut mid-save never leaves a truncated checkpoint under the real name."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as file:  # made here: a folder that refuses it says so as itself
            try:
                torch.save({"format_version": FORMAT_VERSION, **payload}, file)
            except RuntimeError as error:  # torch's writer reports a failed write as a position in its zip
                raise _write_error(file) or error from None
            sync(file)
        replace_on_disk(temporary, path)
    except BaseException as error:  # a second Ctrl-C too: no half-written file of a checkpoint's size is left
        temporary.unlink(missing_ok=True)
        if not isinstance(error, (OSError, RuntimeError)):
            raise
        reason = (error.strerror if isinstance(error, OSError) and error.strerror
                  else f"{error.__class__.__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
        raise CheckpointError(f"{path}: could not be written ({reason}); {kept}") from error


def _write_error(file: Any) -> OSError | None:
    """The system's own error ("No space left on device", "File too large") for a write that torch's
    writer reported only as a position in its zip: one more byte at the end meets it too."""
    try:
        file.seek(0, os.SEEK_END)
        file.write(b"\0")
        file.flush()
    except OSError as error:
        return error
    return None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as error:
        raise CheckpointError(f"{path}: checkpoint not found") from error
    except Exception as error:  # noqa: BLE001 - corrupt zips, pickles with code, truncated files alike
        raise CheckpointError(f"{path}: not a readable checkpoint ({error.__class__.__name__})") from error
    version = payload.get("format_version") if isinstance(payload, dict) else None
    if version == 1:
        if not isinstance(payload.get("config"), dict):  # migrated by its config: none, and it is not one of ours
            raise CheckpointError(f"{path}: not a captioning checkpoint (it has no config)")
        return migrate_v1(payload)
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise CheckpointError(f"{path}: written by a newer version of captioning (checkpoint format {version}; this "
                              f"one reads 1 to {FORMAT_VERSION}): upgrade the package to read it")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: not a captioning checkpoint (format version 1 or {FORMAT_VERSION})")
    return payload


def _renamed_decoder_keys(state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A format-1 decoder state dict under format 2's names (config: the migrated config dict)."""
    renamed = {}
    two_glimpses = any(key.startswith("glimpse.") for key in state)
    unit = bool(config.get("model", {}).get("extras", {}).get("unit_annotations", False))
    for key, value in state.items():
        if two_glimpses and key.startswith("attention."):  # the second glimpse joined the attention module
            key = "attention.first." + key[len("attention."):]
        elif key.startswith("glimpse."):
            key = "attention.second." + key[len("glimpse."):]
        elif key.startswith("layout."):  # the layout is the initial state's summary (extras/layout.py)
            key = "summary." + key
        attention, _, rest = key.rpartition(".position.")  # the learned position is one of attention's inputs
        if attention and attention.startswith("attention"):
            key = f"{attention}.inputs.{1 if unit else 0}.{rest}"
        if key.endswith("batches") and key.startswith("attention"):  # hard attention's warm-up reads the run's step
            continue
        renamed[key] = value
    return renamed


def migrate_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """A format-1 payload as format 2 reads it (a new dict; the numbers are untouched)."""
    payload = dict(payload, format_version=FORMAT_VERSION, migrated_from=1)  # inspect says which it was
    payload["config"] = migrate(payload["config"])
    for name in ("decoder", "training_decoder"):
        if name in payload:
            payload[name] = _renamed_decoder_keys(payload[name], payload["config"])
    return payload


@dataclass(frozen=True)
class View:
    """What one view of the annotations comes from (captioning.model.ensemble): an encoder's settings
    and, where it was fine-tuned (encoder.fine_tune_from), the weights of its own, from `path`."""

    encoder: EncoderConfig
    weights: dict[str, Any] | None
    path: str

    def same_annotations(self, other: View) -> bool:
        """Whether both give the same annotations: frozen, one encoder at one layer, the same weights
        file and border (a cache's batch size or a run's rate change nothing)."""
        def made_of(view: View) -> tuple:
            e = view.encoder
            return e.name, e.layer, e.weights_path, e.padding
        return self.weights is None and other.weights is None and made_of(self) == made_of(other)

    def build(self, device: torch.device) -> Encoder:
        """The encoder, in eval mode on `device`: its own fine-tuned weights, or the pretrained ones its
        config names. A file cut for shipping holds only the stages that were fine-tuned: the frozen
        ones before them are the pretrained weights, unchanged by fine-tuning."""
        encoder = Encoder.from_config(self.encoder)
        if self.weights is not None:
            _load_weights(encoder, float_weights(self.weights), self.path, only=encoder.trainable)
        return encoder.to(device).eval()


def shared_views(sources: Sequence[View]) -> tuple[list[View], list[int]]:
    """The distinct views of decoders' annotations, and which one each decoder reads: decoders over
    the same frozen encoder share its view (one cache, one pass of the encoder); a fine-tuned encoder's
    annotations are its own."""
    views: list[View] = []
    index = []
    for source in sources:
        same = [i for i, view in enumerate(views) if view.same_annotations(source)]
        if not same:
            views.append(source)
        index.append(same[0] if same else len(views) - 1)
    return views, index


@dataclass
class Trained:
    """A checkpoint read for inference, by captioning (captioning.api) and evaluation alike: its
    config (with the overrides given), vocabulary, the grid of its annotations and its decoder, in
    eval mode on `device`. The encoder is built only when asked for: work on a feature cache never
    needs its weights. `views`: what the decoder's annotations come from, one encoder each (several
    for an ensemble whose members do not all read one frozen encoder's)."""

    path: str
    config: Config
    vocab: Vocabulary
    decoder: AttentionDecoder | Ensemble  # an Ensemble: several checkpoints, or a file that holds several
    grid: tuple[int, int]
    device: torch.device
    views: list[View]

    @property
    def encoder_weights(self) -> dict[str, Any] | None:
        """A fine-tuned encoder's own weights (encoder.fine_tune_from); None where it is frozen (the
        first view's, for an ensemble)."""
        return self.views[0].weights

    @property
    def fine_tuned(self) -> bool:
        """Whether any encoder's weights are the checkpoint's own: its annotations then differ from a
        cache of the pretrained encoder's."""
        return any(view.weights is not None for view in self.views)

    def encoder(self) -> Encoder | JoinedEncoder:
        """The encoder the decoder was trained on, in eval mode on `device`: the checkpoint's
        fine-tuned weights, or the pretrained ones its config names; for several views, their
        encoders side by side (JoinedEncoder)."""
        encoders = [view.build(self.device) for view in self.views]
        return encoders[0] if len(encoders) == 1 else JoinedEncoder(encoders).eval()

    def split(self, name: str) -> tuple[Split, Any]:
        """A split of the checkpoint's data and what its decoder reads of it: the feature cache of one
        frozen encoder, or otherwise the images, encoded on demand (a fine-tuned encoder's annotations
        differ from a cache of the pretrained encoder's; the split takes its grid)."""
        cached = len(self.views) == 1 and not self.fine_tuned
        split = load_splits(self.config, (name,), device=self.device, features=cached)[name]
        if cached:
            return split, split.annotations
        split.grid = self.grid
        return split, EncodedImages(self.encoder(), split.records, image_size=self.config.data.image_size,
                                    device=self.device)

    def model(self) -> EncoderDecoder:
        """Pixels in, captions out: the encoder, then the decoder."""
        return EncoderDecoder(encoder=self.encoder(), decoder=self.decoder).eval()


def load_trained(path: str | Path, *, overrides: Sequence[str] = (), may_change: Sequence[str] | None = None,
                 device: str | torch.device = "cpu", payload: dict[str, Any] | None = None) -> Trained:
    """The one loader of a checkpoint for inference. `overrides` ("key.sub=value") change its config,
    but not the model it holds (TRAINED_MODEL: its own values only); `may_change` names the only keys
    they may touch (None: any other), so that captioning can refuse what it has no use for. Each
    problem is one line naming the file. How hard attention picks its cell is checked where it is
    used (captioning.api, captioning.eval.evaluate: refuse_hard_choice), since both may be asked for
    another choice than the config's. `payload`: the checkpoint's contents when the caller has read
    them already (not read twice)."""
    payload = payload if payload is not None else load_checkpoint(path)
    config = config_of(payload, path)
    for text in overrides:
        changed = apply_overrides(copy.deepcopy(config), [text])  # an unknown key or a malformed override says so first
        key = text.split("=", 1)[0].strip()
        if may_change is not None and key not in may_change:
            raise ConfigError(f"override '{text}': {key} cannot change at inference, it is part of the "
                              f"trained model (these can: {', '.join(may_change)})")
        # A checkpoint's own value given again is fine (a script that passes its training's settings);
        # another would be scored or captioned under the checkpoint's name.
        before = _setting(config, key)
        if _part_of_the_model(key) and _setting(changed, key) != before:
            raise ConfigError(f"override '{text}': {key} is {before!r} in {path}, part of the model it holds; "
                              "overrides may say where the data and weights are, and how to decode")
    validate(apply_overrides(config, overrides), f"{path}: config with overrides", unread_sections=True)
    device = torch.device(device)
    decoder: AttentionDecoder | Ensemble = decoder_from_checkpoint(payload, config, path)
    views = [View(config.encoder, payload.get("encoder"), str(path))]
    if payload.get("members"):  # a file of several decoders, cut by for_captioning(members=...)
        members = member_decoders(payload, path)
        for member in members:  # where the encoder's weights are is the machine's, for every member alike
            apply_overrides(member.config, [text for text in overrides if text.startswith("encoder.")])
        views, index = shared_views([*views, *(View(member.config.encoder, member.encoder, str(path))
                                              for member in members)])
        decoder = Ensemble([decoder, *(member.decoder for member in members)], views=index).eval()
    _warn_unless_as_recorded(payload, path)  # once the file is known to hold what a record digests
    return Trained(path=str(path), config=config, vocab=Vocabulary(payload["vocab"]), decoder=decoder.to(device),
                   grid=tuple(payload["grid"]), device=device, views=views)


def _warn_unless_as_recorded(payload: dict[str, Any], path: str | Path) -> None:
    """One line where the weights are not those the checkpoint's record names: torch does not check
    a file's checksums as it reads it, so one bit of an exponent flipped on a disk or in a copy loads
    as a weight above 1e30 and captions nonsense without a word. (A warning, not a refusal: `verify`
    scores such a file.) Attributed to this line, which is the package's wherever it is called from."""
    record = payload.get("record")
    recorded = record.get("weights") if isinstance(record, dict) else None
    if not isinstance(recorded, dict):  # a checkpoint from before records were kept
        return
    held = run_weights(payload)
    changed = [name for name, value in held.items() if name in recorded and recorded[name] != value]
    if changed:
        warnings.warn(f"{path}: its {' and '.join(changed)} weights are not those its record names: changed or "
                      f"damaged since it was written (captioning verify scores it again)", stacklevel=1)


def _part_of_the_model(key: str) -> bool:
    """Whether a setting ("model.dropout", "data.root") is part of TRAINED_MODEL, less HOW_IT_COMPUTES."""
    return key not in HOW_IT_COMPUTES and any(key == part or key.startswith(f"{part}.") for part in TRAINED_MODEL)


def _setting(config: Config, key: str) -> Any:
    """The value of "section.name" (or deeper, into a dict such as model.extras), None where unset."""
    value: Any = config.to_dict()
    for name in key.split("."):
        value = value.get(name) if isinstance(value, dict) else None
    return value


@dataclass
class Member:
    """One of the decoders a file holds beside its own: its config, its decoder and, where its encoder
    was fine-tuned, that encoder's weights."""

    config: Config
    decoder: AttentionDecoder
    encoder: dict[str, Any] | None


def member_decoders(payload: dict[str, Any], path: str | Path) -> list[Member]:
    """The decoders a file holds beside its own ("members"), each built from its own config's model
    section over the file's vocabulary and grid and its own annotations' width (the file's, where an
    older file does not say), with its fine-tuned encoder's weights where it has them."""
    members = payload["members"]
    if not isinstance(members, list) or not all(isinstance(m, dict) and isinstance(m.get("config"), dict)
                                                and isinstance(m.get("decoder"), dict)
                                                and isinstance(m.get("encoder", {}), dict)
                                                and isinstance(m.get("annotation_dim", 1), int) for m in members):
        raise CheckpointError(f"{path}: its members are not decoders with their configs")
    built = []
    for index, member in enumerate(members, start=2):
        config = from_dict(member["config"], where=f"{path}: member {index}'s config")
        own = {"decoder": member["decoder"], "annotation_dim": member.get("annotation_dim", payload["annotation_dim"])}
        built.append(Member(config, decoder_from_checkpoint({**payload, **own}, config, path), member.get("encoder")))
    return built


def load_ensemble(paths: Sequence[str | Path], *, overrides: Sequence[str] = (),
                  may_change: Sequence[str] | None = None, device: str | torch.device = "cpu") -> Trained:
    """Several checkpoints as one model that decodes with the mean of their word probabilities
    (captioning.model.ensemble), or the one checkpoint given. Its config is the first's (with the
    overrides: how to decode). Members over one frozen encoder read one view of the annotations; a
    fine-tuned member (encoder.fine_tune_from), or one over another encoder, reads its own. Every
    member must see the same pixels (one image size, one normalization), attend over one grid and
    say the same words (one vocabulary): otherwise one line naming the member that differs and how."""
    members = [load_trained(path, overrides=overrides, may_change=may_change, device=device) for path in paths]
    if len(members) == 1:
        return members[0]
    first = members[0]
    pixels = normalization(first.config.encoder.name)
    for member in members[1:]:
        differs = [what for what, same in (
            ("vocabulary", member.vocab.words == first.vocab.words),
            ("image size", member.config.data.image_size == first.config.data.image_size),
            ("normalization", normalization(member.config.encoder.name) == pixels),
            ("grid", member.grid == first.grid)) if not same]
        if differs:
            raise ConfigError(f"{member.path}: its {' and '.join(differs)} differ from {first.path}'s; an ensemble's "
                              "members see the same pixels, attend over one grid and say the same words")
    # a file that holds an ensemble adds its decoders one by one: each decoder weighs the same
    decoders, sources = [], []
    for member in members:
        ensemble = member.decoder if isinstance(member.decoder, Ensemble) else None
        decoders += list(ensemble.members) if ensemble else [member.decoder]
        sources += [member.views[view] for view in ensemble.views] if ensemble else [member.views[0]]
    views, index = shared_views(sources)
    return dataclasses.replace(first, path=" + ".join(m.path for m in members), views=views,
                               decoder=Ensemble(decoders, views=index).to(first.device).eval())


def _load_weights(module: torch.nn.Module, state: dict[str, Any], path: str | Path,
                  only: Sequence[str] = ()) -> None:
    """Load `state` into `module`. `only`: the encoder's stages that fine-tuned; the state may hold
    these alone (the others keep their pretrained weights), or everything."""
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except (KeyError, RuntimeError) as error:  # weights of another model under our format's name
        first = str(error).strip().splitlines()[0] if str(error).strip() else error.__class__.__name__
        raise CheckpointError(f"{path}: its weights do not fit the model its config describes ({first})") from error
    stages = tuple(f"body.{stage}." for stage in only)
    lacking = [key for key in missing if not stages or key.startswith(stages)]
    if lacking or unexpected:
        first = f"missing {lacking[0]}" if lacking else f"unexpected {unexpected[0]}"
        raise CheckpointError(f"{path}: its weights do not fit the model its config describes ({first})")


def captioner_from_checkpoint(path: str | Path, *,
                               device: str | torch.device = "cpu") -> tuple[EncoderDecoder, Vocabulary, Config]:
    """The model, vocabulary and config of a checkpoint, in eval mode on `device` (load_trained's, as
    it was named before)."""
    trained = load_trained(path, device=device)
    return trained.model(), trained.vocab, trained.config


def config_of(payload: dict[str, Any], path: str | Path) -> Config:
    """The checkpoint's config, checked; one line naming the file if it is not one of ours."""
    missing = [key for key in ("config", "vocab", "grid", "annotation_dim", "decoder") if key not in payload]
    if missing or not isinstance(payload["config"], dict):
        raise CheckpointError(f"{path}: not a captioning checkpoint (it has no {', '.join(missing) or 'config'})")
    grid = payload["grid"]
    odd = [key for key, fine in (  # a file edited by hand, or another project's: one line, not a traceback
        ("vocab", isinstance(payload["vocab"], list) and all(isinstance(word, str) for word in payload["vocab"])),
        ("grid", isinstance(grid, (list, tuple)) and len(grid) == 2 and all(_whole(n) and n > 0 for n in grid)),
        ("annotation_dim", _whole(payload["annotation_dim"]) and payload["annotation_dim"] > 0),
        ("decoder", isinstance(payload["decoder"], dict))) if not fine]
    if odd:
        raise CheckpointError(f"{path}: not a captioning checkpoint (not as captioning writes them: {', '.join(odd)})")
    return from_dict(payload["config"], where=f"{path}: config")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decoder_from_checkpoint(payload: dict[str, Any], config: Config,
                            path: str | Path = "the checkpoint") -> AttentionDecoder:
    """The decoder alone, in eval mode on the CPU, for work on cached annotations; weights that do not
    fit the model the config describes are one line naming `path`."""
    decoder = build_decoder(config.model, vocab_size=len(payload["vocab"]),
                            annotation_dim=int(payload["annotation_dim"]), grid=tuple(payload["grid"]))
    _load_weights(decoder, float_weights(payload["decoder"]), path)
    return decoder.eval()


def weights_digest(state: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of a state dict's tensors, by name, as stored (any dtype)."""
    hashed = hashlib.sha256()
    for name, value in sorted(state.items()):
        if isinstance(value, torch.Tensor):
            hashed.update(name.encode())
            hashed.update(value.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return hashed.hexdigest()[:16]


def run_weights(payload: dict[str, Any]) -> dict[str, str]:
    """Digests of the weights a checkpoint holds: its decoder's (and its members', in a file that holds
    an ensemble), and a fine-tuned encoder's (whose weights are the checkpoint's own, not its package's)."""
    weights = {"decoder": weights_digest(payload["decoder"])}
    if isinstance(payload.get("members"), list):  # the other decoders of a file that holds an ensemble
        weights["members"] = [weights_digest(member["decoder"]) for member in payload["members"]]
        if any(isinstance(member.get("encoder"), dict) for member in payload["members"]):  # fine-tuned members
            weights["member_encoders"] = [weights_digest(member["encoder"]) if isinstance(member.get("encoder"), dict)
                                          else None for member in payload["members"]]
    if isinstance(payload.get("encoder"), dict):
        weights["encoder"] = weights_digest(payload["encoder"])
    return weights
