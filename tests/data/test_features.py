"""The annotation cache: one per encoder setting, equal to the encoder's output, computed once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from captioning.data.features import cache_dir, load_or_compute
from captioning.data.images import load_image, to_tensor
from captioning.data.karpathy import read_split


def _never():
    raise AssertionError("the encoder factory must not be called when the cache is complete")


def test_each_border_padding_has_its_own_cache(tmp_path: Path) -> None:
    common = {"encoder": "efficientnet_lite0", "layer": "stride16", "image_size": 224, "weights_path": None}
    zeros = cache_dir(tmp_path, **common)
    assert zeros == cache_dir(tmp_path, **common, padding="zeros")  # the caches made before the option still count
    assert len({zeros, cache_dir(tmp_path, **common, padding="reflect"),
                cache_dir(tmp_path, **common, padding="replicate")}) == 3


def test_cached_annotations_match_the_encoder(shapes_root: Path, tiny_config, encoder, tmp_path: Path) -> None:
    image_size = tiny_config(tmp_path).data.image_size
    assert image_size == 96  # a 6x6 grid at stride 16
    records = read_split(shapes_root / "dataset_shapes.json", "val")
    directory = cache_dir(shapes_root, encoder="efficientnet_lite0", layer="stride16", image_size=image_size,
                          weights_path=None)
    cached, grid, _ = load_or_compute(directory, "val", records, encoder_factory=_never, image_size=image_size)
    assert grid == (6, 6)
    assert cached.dtype == np.float16 and cached.shape == (len(records), 36, 112)
    images = torch.stack([to_tensor(load_image(r.path), size=image_size, mean=encoder.mean, std=encoder.std)
                          for r in records[:3]])
    with torch.no_grad():
        live, live_grid = encoder(images)  # [3, L, D] float32, one at a time from the files
    assert live_grid == (6, 6)
    cached_t = torch.from_numpy(np.asarray(cached[:3], dtype=np.float32))
    torch.testing.assert_close(cached_t, live, rtol=2e-3, atol=2e-3)
    assert float(live.abs().max()) > 0.1  # real features, not zeros


def test_two_runs_starting_at_once_compute_the_cache_once(tmp_path: Path, shapes_root: Path, encoder) -> None:
    """Two trainings launched together on the same data: the second waits for the first's cache
    instead of writing the same partial file (which once broke a study run)."""
    import threading
    import time

    records = read_split(shapes_root / "dataset_shapes.json", "test")[:2]
    calls, results = [], []

    def factory():
        calls.append(1)
        time.sleep(0.5)  # both threads are inside load_or_compute by now
        return encoder

    def worker():
        results.append(load_or_compute(tmp_path / "cache", "test", records, encoder_factory=factory, image_size=64))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 2
    assert np.array_equal(np.asarray(results[0].annotations), np.asarray(results[1].annotations))


def test_load_or_compute_computes_once(tmp_path: Path, shapes_root: Path, encoder) -> None:
    records = read_split(shapes_root / "dataset_shapes.json", "test")[:2]
    calls = []

    def factory():
        calls.append(1)
        return encoder

    first, grid, _ = load_or_compute(tmp_path / "cache", "test", records, encoder_factory=factory, image_size=64)
    assert len(calls) == 1 and grid == (4, 4) and first.shape == (2, 16, 112)
    left = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.suffix != ".lock")
    assert left == ["test.json", "test.npy"]  # no temp file
    second, grid_again, _ = load_or_compute(tmp_path / "cache", "test", records, encoder_factory=_never, image_size=64)
    assert grid_again == grid and np.array_equal(np.asarray(first), np.asarray(second))
    # A different list of images is not served from a stale cache.
    third, _, _ = load_or_compute(tmp_path / "cache", "test", records[:1], encoder_factory=factory, image_size=64)
    assert len(calls) == 2 and third.shape == (1, 16, 112)
    np.testing.assert_allclose(np.asarray(third[0], dtype=np.float32), np.asarray(first[0], dtype=np.float32),
                               rtol=2e-3, atol=2e-3)
