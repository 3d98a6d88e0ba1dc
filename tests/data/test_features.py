"""The feature cache: one per encoder setting, equal to the encoder's output, computed once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.data.features import cache_dir, load_or_compute
from captioning.data.formats.karpathy import read_split
from captioning.data.images import load_image, to_tensor
from captioning.data.splits import features_dir


def _never():
    raise AssertionError("the encoder factory must not be called when the cache is complete")


def test_each_border_padding_has_its_own_cache(tmp_path: Path) -> None:
    common = {"encoder": "efficientnet_lite0", "layer": "stride16", "image_size": 224, "weights": "0123456789ab"}
    zeros = cache_dir(tmp_path, **common)
    assert zeros == cache_dir(tmp_path, **common, padding="zeros")
    assert len({zeros, cache_dir(tmp_path, **common, padding="reflect"),
                cache_dir(tmp_path, **common, padding="replicate")}) == 3


def test_the_cache_is_named_by_the_weights_content_not_their_file_name(tmp_path: Path, resnet18_file: Path) -> None:
    """Two files called resnet18.pth with different weights get two caches; one file under two names, one."""
    from captioning.config import load_config
    from captioning.data.splits import features_dir

    first, second, renamed = tmp_path / "a" / "resnet18.pth", tmp_path / "b" / "resnet18.pth", tmp_path / "x.pth"
    for path in (first, second):
        path.parent.mkdir()
    first.write_bytes(resnet18_file.read_bytes())
    state = torch.load(resnet18_file, weights_only=True)
    state["fc.bias"] = state["fc.bias"] + 1  # fine-tuned, say: other weights under the same name
    torch.save(state, second)
    renamed.write_bytes(first.read_bytes())

    def cache(path: Path) -> Path:
        return features_dir(load_config(None, [f"data.root={tmp_path}", "encoder.name=resnet18",
                                               f"encoder.weights_path={path}"]))

    assert cache(first) != cache(second)
    assert cache(first) == cache(renamed)
    embedded = features_dir(load_config(None, [f"data.root={tmp_path}"]))  # the package's EfficientNet-Lite0 file
    assert embedded.name.startswith("efficientnet_lite0-stride16-224-w") and len(embedded.name) == len(
        "efficientnet_lite0-stride16-224-w") + 12


def test_cached_annotations_match_the_encoder(shapes_root: Path, tiny_config, encoder, tmp_path: Path) -> None:
    image_size = tiny_config(tmp_path).data.image_size
    assert image_size == 96  # a 6x6 grid at stride 16
    records = read_split(shapes_root / "dataset_shapes.json", "val")
    directory = features_dir(tiny_config(tmp_path))
    cached, grid, *_ = load_or_compute(directory, "val", records, encoder_factory=_never, image_size=image_size)
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

    first, grid, *_ = load_or_compute(tmp_path / "cache", "test", records, encoder_factory=factory, image_size=64)
    assert len(calls) == 1 and grid == (4, 4) and first.shape == (2, 16, 112)
    left = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.suffix != ".lock")
    assert left == ["test.json", "test.npy"]  # no temp file
    second, grid_again, *_ = load_or_compute(tmp_path / "cache", "test", records, encoder_factory=_never, image_size=64)
    assert grid_again == grid and np.array_equal(np.asarray(first), np.asarray(second))
    # A different list of images is not served from a stale cache.
    third, *_ = load_or_compute(tmp_path / "cache", "test", records[:1], encoder_factory=factory, image_size=64)
    assert len(calls) == 2 and third.shape == (1, 16, 112)
    np.testing.assert_allclose(np.asarray(third[0], dtype=np.float32), np.asarray(first[0], dtype=np.float32),
                               rtol=2e-3, atol=2e-3)


def _copy_split(shapes_root: Path, tmp_path: Path, split: str = "val") -> list:
    """The split's images copied under tmp_path (so that the test may change them), as records."""
    import dataclasses
    import shutil

    records = read_split(shapes_root / "dataset_shapes.json", split)
    copied = []
    for record in records:
        target = tmp_path / "images" / record.path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(record.path, target)
        copied.append(dataclasses.replace(record, path=target))
    return copied


def test_an_image_changed_after_caching_is_encoded_again(shapes_root: Path, encoder, tmp_path: Path, capsys) -> None:
    import os

    records = _copy_split(shapes_root, tmp_path)
    directory = tmp_path / "features"
    first = load_or_compute(directory, "val", records, encoder_factory=lambda: encoder, image_size=96)
    before = np.array(first.annotations)
    changed = records[2].path
    changed.write_bytes(records[5].path.read_bytes())  # another picture under the same name
    os.utime(changed, ns=(os.stat(changed).st_atime_ns, os.stat(changed).st_mtime_ns + 10**9))
    capsys.readouterr()
    second = load_or_compute(directory, "val", records, encoder_factory=lambda: encoder, image_size=96)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(notes) == 1 and "1 image changed since the cache was made" in notes[0] and str(changed) in notes[0]
    after = np.array(second.annotations)
    assert np.array_equal(after[2], before[5])  # row 2 now holds what the new picture gives
    assert np.array_equal(np.delete(after, 2, axis=0), np.delete(before, 2, axis=0))  # the rest untouched
    third = load_or_compute(directory, "val", records, encoder_factory=_never, image_size=96)  # nothing changed now
    assert np.array_equal(np.array(third.annotations), after) and capsys.readouterr().err == ""


def test_two_rows_whose_files_swap_places_are_encoded_again(shapes_root: Path, encoder, tmp_path: Path,
                                                           capsys) -> None:
    """The same image ids, each file's size and time as cached, but rows 1 and 3 now name each
    other's file (a captions file edited, or two photos renamed): each row gets its own file's
    annotations. A cache written before caches kept their paths takes the present ones once."""
    import dataclasses
    import json

    records = _copy_split(shapes_root, tmp_path)
    directory = tmp_path / "features"
    before = np.array(load_or_compute(directory, "val", records, encoder_factory=lambda: encoder,
                                      image_size=96).annotations)
    swapped = list(records)
    swapped[1] = dataclasses.replace(records[1], path=records[3].path)
    swapped[3] = dataclasses.replace(records[3], path=records[1].path)
    capsys.readouterr()
    after = np.array(load_or_compute(directory, "val", swapped, encoder_factory=lambda: encoder,
                                     image_size=96).annotations)
    assert "2 images changed" in capsys.readouterr().err
    assert np.array_equal(after[1], before[3]) and np.array_equal(after[3], before[1])
    meta_path = directory / "val.json"
    meta = json.loads(meta_path.read_text())
    del meta["paths"]  # as a cache made before
    meta_path.write_text(json.dumps(meta))
    load_or_compute(directory, "val", swapped, encoder_factory=_never, image_size=96)  # nothing to encode
    assert "paths" in json.loads(meta_path.read_text())


@pytest.mark.parametrize("damage", ["flip", "truncate", "description"])
def test_a_damaged_cache_is_reported_and_rebuilt_never_read(shapes_root: Path, encoder, tmp_path: Path, capsys,
                                                            damage: str) -> None:
    records = _copy_split(shapes_root, tmp_path)
    directory = tmp_path / "features"
    good = np.array(load_or_compute(directory, "val", records, encoder_factory=lambda: encoder,
                                    image_size=96).annotations)
    array_path = directory / "val.npy"
    data = bytearray(array_path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF  # one byte in the middle of the rows
        array_path.write_bytes(bytes(data))
    elif damage == "truncate":
        array_path.write_bytes(bytes(data[: len(data) - 1000]))
    else:
        (directory / "val.json").write_text("{not json")
    capsys.readouterr()
    built = []
    rebuilt = load_or_compute(directory, "val", records, encoder_factory=lambda: built.append(1) or encoder,
                              image_size=96)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "damaged" in line]
    assert len(warnings) == 1 and str(array_path) in warnings[0] and "rebuilding" in warnings[0]
    assert built == [1] and np.array_equal(np.array(rebuilt.annotations), good)


def _interrupted(monkeypatch, encoder, *, after_batches: int) -> None:
    """The encoder stops the run (as a kill would) at its next call after `after_batches` batches."""
    calls, real = [], encoder.forward

    def forward(images):
        calls.append(images.shape[0])
        if len(calls) == after_batches + 2:  # its first call sizes the cache on a blank image
            raise KeyboardInterrupt("killed")
        return real(images)

    monkeypatch.setattr(encoder, "forward", forward)


def test_an_image_changed_while_a_cache_was_interrupted_is_encoded_again(shapes_root: Path, encoder, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """A resumed cache kept the rows done before the stop, and recorded every file as it was at the
    resume: a row whose image changed in between kept the old image's annotations for good."""
    import os

    from captioning.data.features import write_cache

    records = _copy_split(shapes_root, tmp_path)
    _interrupted(monkeypatch, encoder, after_batches=2)
    with pytest.raises(KeyboardInterrupt):
        write_cache(tmp_path / "cut", "val", records, encoder=encoder, image_size=96, batch_size=2)
    monkeypatch.undo()
    changed = records[0].path  # encoded before the stop
    changed.write_bytes(records[5].path.read_bytes())
    os.utime(changed, ns=(os.stat(changed).st_atime_ns, os.stat(changed).st_mtime_ns + 10**9))
    resumed = load_or_compute(tmp_path / "cut", "val", records, encoder_factory=lambda: encoder, image_size=96,
                              batch_size=2)
    whole = load_or_compute(tmp_path / "whole", "val", records, encoder_factory=lambda: encoder, image_size=96)
    np.testing.assert_array_equal(np.asarray(resumed.annotations), np.asarray(whole.annotations))
    again = load_or_compute(tmp_path / "cut", "val", records, encoder_factory=_never, image_size=96)
    np.testing.assert_array_equal(np.asarray(again.annotations), np.asarray(whole.annotations))
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [".val.lock", "val.json", "val.npy"]


def test_a_marker_left_by_a_finished_cache_never_passes_a_new_partial_file_off_as_done(
        shapes_root: Path, encoder, tmp_path: Path, monkeypatch) -> None:
    """A kill between a cache's last steps left its progress marker (every row done). A rebuild of the
    split stopped before its first marker write then resumed at the end, and an all-zero cache, its
    checksums over the zeros, was read as complete."""
    from captioning.data import features

    records = _copy_split(shapes_root, tmp_path)
    directory = tmp_path / "features"
    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: None)  # killed before the marker went
    whole = np.asarray(features.write_cache(directory, "val", records, encoder=encoder, image_size=96).annotations)
    monkeypatch.undo()
    assert (directory / ".val.progress.json").exists()
    for name in ("val.npy", "val.json"):  # damaged, say, and removed to be rebuilt
        (directory / name).unlink()

    def killed_while_reserving(path: Path) -> None:
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(features, "_reserve", killed_while_reserving)
    with pytest.raises(KeyboardInterrupt):
        features.write_cache(directory, "val", records, encoder=encoder, image_size=96)
    monkeypatch.undo()
    rebuilt = features.write_cache(directory, "val", records, encoder=encoder, image_size=96)
    np.testing.assert_array_equal(np.asarray(rebuilt.annotations), whole)


def test_a_run_on_the_first_images_keeps_its_cache_beside_the_whole_splits(shapes_root: Path, tiny_config,
                                                                           tmp_path: Path) -> None:
    """data.max_images (a quick look at a partial download) wrote its few images' cache over the whole
    split's: the next full run encoded every image again, hours of COCO."""
    from captioning.data.splits import load_splits

    whole = tiny_config(tmp_path / "run", f"data.cache_root={tmp_path}")
    first = tiny_config(tmp_path / "run", f"data.cache_root={tmp_path}", "data.max_images=3")
    full = np.asarray(load_splits(whole, ("val",))["val"].annotations)
    kept = (features_dir(whole) / "val.npy").read_bytes()
    few = np.asarray(load_splits(first, ("val",))["val"].annotations)
    assert few.shape[0] == 3 and np.array_equal(few, full[:3])
    assert features_dir(first) == features_dir(whole) / "first3"
    assert (features_dir(whole) / "val.npy").read_bytes() == kept
    again = load_splits(whole, ("val",))["val"]  # read, not computed: the whole split's cache is there
    assert np.array_equal(np.asarray(again.annotations), full)
