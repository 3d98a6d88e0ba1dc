"""Reading images (grayscale, palette, CMYK, alpha, 16-bit, broken files) and turning them into encoder input."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data.images import ImageReadError, crop_box, load_image, to_tensor


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


