"""One split of a dataset, ready for the decoder: its images, references, cached annotations and,
where the dataset has them, the objects that captions and attention are scored against (the shapes
data's boxes, COCO's instances annotations)."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from captioning.config import Config
from captioning.config.choices import stage_names
from captioning.data.dataset import by_reference
from captioning.data.features import cache_dir, load_or_compute
from captioning.data.flips import mirror_image
from captioning.data.instances import Instances, split_instances
from captioning.data.records import (
    DatasetError,
    ImageRecord,
    first_names,
    format_extra,
    read_records,
    too_many_unreadable,
)
from captioning.data.shapes.scenes import SceneObjects
from captioning.model.encoder import Encoder, weights_identity


class Rows:
    """The rows `index` of a (memory-mapped) array, read lazily: rows[a:b] reads only those rows."""

    def __init__(self, array: np.ndarray, index: list[int]):
        self.array, self.index = array, np.asarray(index, dtype=np.int64)
        self.shape = (len(index), *array.shape[1:])
        self.dtype = array.dtype

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict:
        return by_reference(self.__dict__)  # a DataLoader worker maps the cache again rather than receive a copy

    def __getitem__(self, key: int | slice) -> np.ndarray | Rows:
        if isinstance(key, slice):  # still lazy: a view of the chosen rows
            return Rows(self.array, self.index[key].tolist())
        return self.array[self.index[key]]

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        rows = self.array[self.index]
        return rows if dtype is None else rows.astype(dtype)


@dataclass
class Split:
    name: str
    records: list[ImageRecord]
    annotations: np.ndarray | Rows | None  # [N, L, D] fp16, memory-mapped; None when the encoder runs on the fly
    grid: tuple[int, int] | None  # (Hg, Wg), L = Hg * Wg; known once annotations exist
    scenes: list[SceneObjects] | None  # per image, for attention correctness (captioning.eval.shapes)
    unreadable: int = 0  # images of the split skipped because they could not be read
    # the same images' annotations from their mirror images [N, L, D]: the train split, with data.mirror
    mirrored_annotations: np.ndarray | None = None
    # COCO's instances annotations of its images, read when first asked for (captioning.eval.coco)
    instances: Instances | None = None
    # each image file's digest (data/images.py), as the feature cache holds them; None: not known
    contents: list[str | None] | None = None

    @property
    def image_ids(self) -> list[int]:
        return [r.image_id for r in self.records]

    @property
    def references(self) -> list[tuple[str, ...]]:
        return [r.captions for r in self.records]


def uses_feature_cache(config: Config) -> bool:
    """Whether training reads a feature cache: a frozen encoder's annotations, or with
    encoder.cache_frozen the output of a fine-tuned encoder's frozen stages. A fine-tuned encoder's
    own annotations change at every step, so they are never cached."""
    return config.data.feature_cache and (config.encoder.fine_tune_from is None or config.encoder.cache_frozen)


def reads_frozen_stages(config: Config) -> bool:
    """Whether the cache holds the frozen stages' output (encoder.cache_frozen) rather than annotations."""
    return uses_feature_cache(config) and config.encoder.fine_tune_from is not None


def cache_encoder(config: Config) -> Encoder:
    """What the feature cache holds the output of: the encoder, or its frozen stages (encoder.cache_frozen)."""
    encoder = Encoder.from_config(config.encoder)
    return encoder.frozen_stages() if reads_frozen_stages(config) else encoder


def features_dir(config: Config) -> Path:
    """The feature cache's folder; the frozen stages' cache is named after the last of them (block5,
    layer3), where the encoder's is named after its layer (stride32). A run on the first
    data.max_images images keeps its cache in a folder of its own inside: in the full one, it would
    replace the whole split's cache, hours of COCO, with a few images'."""
    d, e = config.data, config.encoder
    layer = e.layer
    if reads_frozen_stages(config):
        stages = stage_names(e.name, e.layer)
        layer = stages[stages.index(e.fine_tune_from) - 1]
    folder = cache_dir(d.cache_root or d.root, encoder=e.name, layer=layer, image_size=d.image_size,
                       weights=weights_identity(e.name, e.weights_path), padding=e.padding)
    return folder if d.max_images is None else folder / f"first{d.max_images}"


def missing_caches(config: Config, names: tuple[str, ...]) -> list[Path]:
    """The feature caches of these splits (and the train split's mirror images, with data.mirror)
    that are not there yet: a cache file appears only once complete."""
    directory = features_dir(config)
    names = (*names, "train_mirrored") if config.data.mirror and "train" in names else names
    return [directory / f"{name}.npy" for name in names if not (directory / f"{name}.npy").exists()]


def check_bad_images(split: str, bad: list[Path | str], total: int, *, limit: float) -> None:
    """Name a split's unreadable images once (how many, the first few); stop if they are more than
    `limit` of it (data.max_bad_images): a folder of broken files should not train quietly on the rest."""
    if not bad:
        return
    problem = too_many_unreadable(split, bad, total, limit=limit)
    if problem is not None:
        raise DatasetError(problem)
    names = first_names(bad)
    print(f"warning: {split}: {len(bad)} of {total} images cannot be read and are left out ({names})", file=sys.stderr)


def load_splits(config: Config, names: tuple[str, ...], *, device: str | torch.device = "cpu",
                features: bool = True, num_workers: int = 0) -> dict[str, Split]:
    """The named splits; with `features`, their cached annotations, computing any missing cache with
    one shared encoder (with data.mirror, the train split's mirror images too). Images that cannot be
    read are left out of the split, with a warning."""
    encoder = functools.cache(lambda: cache_encoder(config))
    cache = functools.partial(load_or_compute, features_dir(config), encoder_factory=encoder,
                              image_size=config.data.image_size, batch_size=config.encoder.batch_size,
                              device=device, num_workers=num_workers)
    splits = {}
    for name in names:
        records = read_records(config.data, name)
        truth = format_extra(config.data, "scenes")  # what a format knows of its images' objects (shapes)
        scenes = truth(config.data, records) if truth is not None else None
        if not features:
            splits[name] = Split(name, records, None, None, scenes,
                                 instances=split_instances(config.data, [r.image_id for r in records]))
            continue
        cached = cache(name, records)
        annotations: np.ndarray | Rows = cached.annotations
        contents = cached.contents
        if cached.unreadable:
            check_bad_images(name, [records[i].path for i in cached.unreadable], len(records),
                             limit=config.data.max_bad_images)
            bad = set(cached.unreadable)
            keep = [i for i in range(len(records)) if i not in bad]
            annotations = Rows(cached.annotations, keep)
            records = [records[i] for i in keep]
            contents = [contents[i] for i in keep] if contents is not None else None
            scenes = [scenes[i] for i in keep] if scenes is not None else None
        mirrored = None
        if name == "train" and config.data.mirror:  # a cache of their own, of the readable images
            mirrored = cache("train_mirrored", records, transform=mirror_image).annotations
        splits[name] = Split(name, records, annotations, cached.grid, scenes, unreadable=len(cached.unreadable),
                             mirrored_annotations=mirrored, contents=contents,
                             instances=split_instances(config.data, [r.image_id for r in records]))
    return splits
