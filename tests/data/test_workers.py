"""DataLoader workers and the feature cache: a dataset over the memory-mapped cache pickles to a few
KB (the file's name, not its contents) and a worker started with spawn maps the same file again."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from captioning.data.dataset import CaptionPairs, MappedFile, collate
from captioning.data.flips import MirroredPairs, mirror_words
from captioning.data.records import ImageRecord
from captioning.data.splits import Rows
from captioning.data.tokenized import Tokenized
from captioning.data.vocab import Vocabulary, tokenize
from captioning.train.scst import TrainingImages, collate_image_rows

N, L, D = 64, 49, 640  # [N, L, D] fp16: 4 MB, far more than any pickled dataset below may weigh
SMALL = 16 * 1024  # bytes: the pairs' arrays (twice for mirrored pairs) and the file's name, not the annotations


def _cache(path: Path, seed: int) -> np.memmap:
    """A cache file as captioning.data.features writes and opens it."""
    values = np.random.default_rng(seed).standard_normal((N, L, D)).astype(np.float16)
    np.save(path, values)
    return np.load(path, mmap_mode="r")


@pytest.fixture
def cache(tmp_path: Path) -> tuple[np.memmap, np.memmap]:
    return _cache(tmp_path / "train.npy", 0), _cache(tmp_path / "train_mirrored.npy", 1)


def _records() -> list[ImageRecord]:
    return [ImageRecord(i, Path(f"{i}.png"), (f"a circle to the left of {i % 3} squares", "a square"))
            for i in range(N)]


def _datasets(cache: tuple[np.memmap, np.memmap]) -> dict[str, torch.utils.data.Dataset]:
    annotations, mirrored = cache
    records = _records()
    vocab = Vocabulary.build([tokenize(c) for r in records for c in r.captions] + [["right"]])
    readable = Rows(annotations, [i for i in range(N) if i != 5])  # a split with an unreadable image left out
    captions = Tokenized.of([r.captions for r in records])
    readable_captions = Tokenized.of([r.captions for r in records[:5] + records[6:]])
    return {
        "pairs": CaptionPairs(annotations, captions, vocab),
        "pairs over rows": CaptionPairs(readable, readable_captions, vocab),
        "mirrored pairs": MirroredPairs(CaptionPairs(annotations, captions, vocab),
                                        CaptionPairs(mirrored, captions, vocab, words=mirror_words)),
        "images": TrainingImages(annotations),
        "images over rows": TrainingImages(readable),
    }


def _same(a, b) -> bool:
    if isinstance(a, (torch.Tensor, np.ndarray)):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", ["pairs", "pairs over rows", "mirrored pairs", "images", "images over rows"])
def test_a_dataset_over_the_cache_pickles_to_a_few_kb_and_reads_the_same_items(cache, name):
    dataset = _datasets(cache)[name]
    data = pickle.dumps(dataset)
    assert len(data) < SMALL, f"{name} pickles to {len(data)} bytes: the cache went with it"
    again = pickle.loads(data)
    assert len(again) == len(dataset)
    for index in (0, 1, len(dataset) // 2, len(dataset) - 1):
        assert _same(again[index], dataset[index]), (name, index)


def test_only_a_read_only_map_of_a_whole_file_is_pickled_by_its_name(cache, tmp_path):
    annotations, _ = cache
    described = MappedFile.of(annotations)
    assert described is not None and described.offset > 0 and described.shape == (N, L, D)
    again = pickle.loads(pickle.dumps(described))  # the description unpickles as the map itself
    assert isinstance(again, np.memmap) and again.mode == "r" and np.array_equal(again, annotations)
    assert MappedFile.of(annotations[3:]) is None  # a view: the file does not say which part
    assert MappedFile.of(np.asarray(annotations)) is None  # in memory
    assert MappedFile.of(np.load(tmp_path / "train.npy", mmap_mode="r+")) is None  # writable: not shared as is
    fortran = np.asfortranarray(np.arange(12, dtype=np.float16).reshape(3, 4))
    np.save(tmp_path / "fortran.npy", fortran)
    mapped = np.load(tmp_path / "fortran.npy", mmap_mode="r")
    assert np.array_equal(pickle.loads(pickle.dumps(MappedFile.of(mapped))), fortran)


def _items(loader: DataLoader) -> list:
    return [batch for batch in loader]


def test_spawned_workers_yield_exactly_what_the_main_process_reads(cache):
    """Two workers started with spawn (as on macOS, Windows and with CUDA): each unpickles the
    dataset and maps the cache again; the batches are those of num_workers=0, in order."""
    datasets = _datasets(cache)
    pairs, images = datasets["mirrored pairs"], datasets["images over rows"]
    generator = torch.Generator().manual_seed(0)
    pair_batches = torch.randperm(len(pairs), generator=generator)[:40].view(5, 8).tolist()
    image_batches = torch.randperm(len(images), generator=generator)[:24].view(3, 8).tolist()
    for dataset, batches, collate_fn in ((pairs, pair_batches, collate), (images, image_batches, collate_image_rows)):
        inline = _items(DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn, num_workers=0))
        spawned = _items(DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn, num_workers=2,
                                    multiprocessing_context="spawn"))
        assert len(spawned) == len(inline) == len(batches)
        for a, b in zip(inline, spawned):
            assert _same(list(vars(a).values()), list(vars(b).values()))
