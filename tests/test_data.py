"""Data: split files, image reading, encoder input, collation, caption pairs and the feature cache."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data.dataset import CaptionPairs, collate
from captioning.data.features import cache_dir, load_or_compute
from captioning.data.images import ImageReadError, crop_box, load_image, to_tensor
from captioning.data.karpathy import DatasetError, ImageRecord, read_split
from captioning.data.shapes.scenes import make_shapes
from captioning.data.vocab import Vocabulary, tokenize

# split files ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small")
    make_shapes(out, {"train": 3, "val": 2, "test": 1}, seed=1, image_size=48)
    return out


def test_read_split_reads_each_split(small_dataset: Path) -> None:
    split_file = small_dataset / "dataset_shapes.json"
    sizes = {name: len(read_split(split_file, name)) for name in ("train", "val", "test")}
    assert sizes == {"train": 3, "val": 2, "test": 1}
    records = read_split(split_file, "val")
    assert all(r.path.is_file() and len(r.captions) == 5 for r in records)
    assert records[0].path == small_dataset / "images" / "val" / "val_00000.png"
    assert len({r.image_id for s in ("train", "val", "test") for r in read_split(split_file, s)}) == 6


def test_read_split_takes_restval_into_train_and_flickr_style_entries(tmp_path: Path) -> None:
    entries = [
        {"filename": "a.jpg", "split": "train", "sentences": [{"raw": "A dog."}]},
        {"filename": "b.jpg", "split": "restval", "sentences": [{"raw": "A cat."}]},
        {"filename": "c.jpg", "split": "val", "sentences": [{"raw": "A cow."}]},
    ]
    split_file = tmp_path / "dataset_flickr8k.json"
    split_file.write_text(json.dumps({"images": entries}))
    train = read_split(split_file, "train", image_root=tmp_path / "imgs")
    assert [r.path.name for r in train] == ["a.jpg", "b.jpg"]
    assert train[0].path == tmp_path / "imgs" / "a.jpg"
    assert [r.image_id for r in train] == [0, 1]  # no cocoid/imgid: the position in the file
    assert read_split(split_file, "val")[0].captions == ("A cow.",)


def test_read_split_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "dataset_coco.json"
    with pytest.raises(DatasetError, match="dataset_coco.json"):
        read_split(missing, "train")


@pytest.mark.parametrize("text", ["{not json", '{"no_images": []}', '{"images": [{"split": "train"}]}', "[1, 2]"])
def test_read_split_malformed_file_names_it(tmp_path: Path, text: str) -> None:
    split_file = tmp_path / "broken_split.json"
    split_file.write_text(text)
    with pytest.raises(DatasetError) as error:
        read_split(split_file, "train")
    assert str(split_file) in str(error.value)


def test_read_split_empty_split_is_an_error(small_dataset: Path) -> None:
    with pytest.raises(DatasetError, match="no images in split 'restval2'"):
        read_split(small_dataset / "dataset_shapes.json", "restval2")


# images --------------------------------------------------------------------------------------------


def _save(image: Image.Image, path: Path, **kwargs) -> Path:
    image.save(path, **kwargs)
    return path


def test_load_image_grayscale(tmp_path: Path) -> None:
    path = _save(Image.new("L", (20, 10), 77), tmp_path / "gray.png")
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (20, 10)
    assert np.all(np.asarray(image) == 77)


def test_load_image_palette(tmp_path: Path) -> None:
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 200, 30, 60] + [0] * 762)
    image = load_image(_save(palette, tmp_path / "palette.png"))
    assert image.mode == "RGB"
    assert np.array_equal(np.asarray(image)[0, 0], [200, 30, 60])


def test_load_image_cmyk_jpeg(tmp_path: Path) -> None:
    cmyk = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # pure red in CMYK
    path = _save(cmyk, tmp_path / "cmyk.jpg", quality=95)
    with Image.open(path) as raw:
        assert raw.mode == "CMYK"
    pixels = np.asarray(load_image(path)).astype(int)
    assert pixels.shape == (16, 16, 3)
    assert np.abs(pixels[8, 8] - [255, 0, 0]).max() < 20


def test_load_image_rgba(tmp_path: Path) -> None:
    path = _save(Image.new("RGBA", (5, 7), (10, 20, 30, 128)), tmp_path / "rgba.png")
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (5, 7)
    assert np.array_equal(np.asarray(image)[3, 2], [10, 20, 30])


def test_load_image_16_bit_is_scaled_not_clipped(tmp_path: Path) -> None:
    values = np.full((6, 9), 32768, dtype=np.uint16)
    values[0, 0], values[0, 1] = 0, 65535
    path = _save(Image.fromarray(values), tmp_path / "gray16.png")
    with Image.open(path) as raw:
        assert raw.mode.startswith("I")
    pixels = np.asarray(load_image(path)).astype(int)
    assert pixels.shape == (6, 9, 3)
    assert np.abs(pixels[3, 3] - 128).max() <= 1  # mid-gray stays mid-gray, not white
    assert pixels[0, 0].tolist() == [0, 0, 0] and pixels[0, 1].tolist() == [255, 255, 255]


def test_load_image_truncated_garbage_and_missing_files_name_the_path(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"this is not an image at all" * 10)
    missing = tmp_path / "missing.png"
    for path in (truncated, garbage, missing):
        with pytest.raises(ImageReadError) as error:
            load_image(path)
        assert str(path) in str(error.value)
        assert "\n" not in str(error.value)


def test_crop_box_is_the_centre_square() -> None:
    assert crop_box(300, 200) == (50, 0, 250, 200)
    assert crop_box(200, 300) == (0, 50, 200, 250)
    assert crop_box(64, 64) == (0, 0, 64, 64)
    assert crop_box(101, 100) == (0.5, 0, 100.5, 100)


def test_to_tensor_shape_normalization_and_centre_crop() -> None:
    pixels = np.zeros((200, 300, 3), dtype=np.uint8)
    pixels[:, :40] = (255, 0, 0)  # red left margin, outside the centre square (x 50..250)
    pixels[:, 40:] = (255, 255, 255)
    tensor = to_tensor(Image.fromarray(pixels), size=32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert tensor.shape == (3, 32, 32) and tensor.dtype == torch.float32
    torch.testing.assert_close(tensor, torch.ones(3, 32, 32), atol=1e-3, rtol=0)  # white -> 1, no red seen
    black = to_tensor(Image.new("RGB", (40, 90)), size=16, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert black.shape == (3, 16, 16)
    torch.testing.assert_close(black, torch.full((3, 16, 16), -2.0))


# collate and caption pairs -------------------------------------------------------------------------


def test_collate_pads_with_zero_and_keeps_lengths() -> None:
    items = [(torch.full((4, 3), float(i)), ids) for i, ids in enumerate([[1, 5, 2], [1, 5, 6, 7, 2], [1, 8, 9, 2]])]
    batch = collate(items)
    assert batch.annotations.shape == (3, 4, 3)
    assert torch.equal(batch.annotations[:, 0, 0], torch.tensor([0.0, 1.0, 2.0]))
    assert batch.lengths.tolist() == [3, 5, 4]
    assert batch.tokens.tolist() == [[1, 5, 2, 0, 0], [1, 5, 6, 7, 2], [1, 8, 9, 2, 0]]
    assert Vocabulary.pad_id == 0


def test_caption_pairs_clip_training_targets() -> None:
    captions = ("a red circle to the left of a blue square", "a circle")
    records = [ImageRecord(0, Path("x.png"), captions), ImageRecord(1, Path("y.png"), ("a blue square",))]
    vocab = Vocabulary.build([tokenize(c) for r in records for c in r.captions])
    annotations = np.arange(2 * 4 * 3, dtype=np.float16).reshape(2, 4, 3)
    pairs = CaptionPairs(annotations, records, vocab, max_length=3)
    assert len(pairs) == 3
    first, tokens = pairs[0]
    assert first.dtype == torch.float32 and torch.equal(first, torch.from_numpy(annotations[0]).float())
    assert tokens == [vocab.start_id, *[vocab.index[w] for w in ("a", "red", "circle")], vocab.end_id]
    assert pairs[1][1] == [vocab.start_id, vocab.index["a"], vocab.index["circle"], vocab.end_id]
    assert torch.equal(pairs[2][0], torch.from_numpy(annotations[1]).float())
    unclipped = CaptionPairs(annotations, records, vocab)
    assert len(unclipped[0][1]) == 10 + 2


# the feature cache ---------------------------------------------------------------------------------


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
