"""Reading images (grayscale, palette, CMYK, alpha, 16-bit, broken files) and turning them into encoder input."""

from __future__ import annotations

import io
import re
import struct
import warnings
import zlib
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


def test_load_image_alpha_is_over_white_as_a_viewer_shows_it(tmp_path: Path) -> None:
    rgba = Image.new("RGBA", (5, 7), (10, 20, 30, 128))
    rgba.putpixel((0, 0), (0, 0, 0, 0))  # fully transparent: stored black, seen as the page behind it
    image = load_image(_save(rgba, tmp_path / "rgba.png"))
    assert image.mode == "RGB" and image.size == (5, 7)
    assert np.asarray(image)[0, 0].tolist() == [255, 255, 255]
    half = 128 / 255
    expected = [round(v * half + 255 * (1 - half)) for v in (10, 20, 30)]
    assert np.abs(np.asarray(image)[3, 2].astype(int) - expected).max() <= 1
    gray_alpha = load_image(_save(Image.new("LA", (4, 4), (0, 0)), tmp_path / "la.png"))
    assert np.all(np.asarray(gray_alpha) == 255)
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([0, 0, 0, 200, 30, 60] + [0] * 762)
    palette.putpixel((1, 1), 1)
    palette.info["transparency"] = 0  # colour 0 is transparent
    pixels = np.asarray(load_image(_save(palette, tmp_path / "palette_alpha.png")))
    assert pixels[0, 0].tolist() == [255, 255, 255] and pixels[1, 1].tolist() == [200, 30, 60]


@pytest.mark.parametrize(("orientation", "corner"), [(1, (0, 0)), (3, (9, 19)), (6, (0, 9)), (8, (19, 0))])
def test_load_image_turns_photos_upright_by_their_exif_orientation(tmp_path: Path, orientation: int,
                                                                   corner: tuple[int, int]) -> None:
    """A 20x10 picture stored with a red top-left pixel; the EXIF tag says how a viewer turns it.
    `corner` is (row, column) of that pixel once upright (EXIF 2.3: 3 = 180 degrees, 6 = 90 clockwise,
    8 = 90 counter-clockwise)."""
    stored = Image.new("RGB", (20, 10), (0, 0, 255))
    stored.putpixel((0, 0), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = _save(stored, tmp_path / "phone.png", exif=exif)
    pixels = np.asarray(load_image(path))
    assert pixels.shape[:2] == ((10, 20) if orientation in (1, 3) else (20, 10))
    red = np.argwhere((pixels[..., 0] > 200) & (pixels[..., 2] < 50))
    assert red.tolist() == [list(corner)]


def test_load_image_first_frame_of_an_animation(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    path = tmp_path / "animated.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100)
    assert np.asarray(load_image(path))[4, 4].tolist() == [255, 0, 0]


def test_load_image_32_bit_float(tmp_path: Path) -> None:
    values = np.full((4, 4), 0.5, dtype=np.float32) * 255
    path = _save(Image.fromarray(values, mode="F"), tmp_path / "float.tiff")
    assert np.asarray(load_image(path))[0, 0].tolist() == [128, 128, 128]
    unit = _save(Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32), mode="F"), tmp_path / "unit.tiff")
    assert np.asarray(load_image(unit))[0, 0].tolist() == [128, 128, 128]  # floats in [0, 1]: not black


def test_a_dark_16_bit_photo_stays_dark_whatever_its_brightest_pixel(tmp_path: Path) -> None:
    """16 bits scale by 65535; the scale once came from the brightest pixel, so a photo whose pixels
    all stayed below 256 came out 257 times brighter than one that had a single pixel at 256."""
    for top in (255, 256):
        values = np.full((4, 4), 128, dtype=np.uint16)
        values[0, 0] = top
        path = _save(Image.fromarray(values), tmp_path / f"dark{top}.png")
        assert Image.open(path).mode == "I;16"
        pixels = np.asarray(load_image(path))
        assert pixels[1, 1].tolist() == [0, 0, 0] and pixels[0, 0].tolist() == [1, 1, 1]  # 128 and 255 of 65535


def _bomb(path: Path) -> Path:
    """A valid 8x8 PNG whose header claims 30000x30000 pixels (CRC fixed, so only the size is wrong)."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = struct.pack(">II", 30000, 30000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))
    return path


def test_bad_files_each_get_one_line_naming_the_file_and_the_problem(tmp_path: Path, monkeypatch) -> None:
    empty = tmp_path / "empty.jpg"
    empty.touch()
    folder = tmp_path / "folder.png"
    folder.mkdir()
    cases = {_bomb(tmp_path / "bomb.png"): "too large", empty: "empty file", folder: "is a folder"}
    for path, problem in cases.items():
        with pytest.raises(ImageReadError) as error:
            load_image(path)
        message = str(error.value)
        assert message.startswith(f"{path}: ") and problem in message and "\n" not in message
    locked = _save(Image.new("RGB", (4, 4)), tmp_path / "locked.png")

    def no_permission(*args, **kwargs):  # as a non-root user would get from chmod 000 (tests may run as root)
        raise PermissionError(13, "Permission denied", str(locked))

    monkeypatch.setattr(Image, "open", no_permission)
    with pytest.raises(ImageReadError, match=re.escape(f"{locked}: permission denied")):
        load_image(locked)


def test_any_error_a_decoder_raises_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """Crafted files make Pillow's plugins raise whatever they raise; a folder must go on."""
    path = _save(Image.new("RGB", (4, 4)), tmp_path / "crafted.png")

    def crash(self, *args, **kwargs):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(Image.Image, "load", crash)
    with pytest.raises(ImageReadError, match=re.escape(f"{path}: cannot read image (IndexError: tuple index")):
        load_image(path)


@pytest.mark.parametrize("size", [(1, 3000), (3000, 1), (2, 5), (1, 1)])
def test_extreme_aspect_ratios_become_encoder_input_and_overlays(size: tuple[int, int]) -> None:
    from captioning.eval.overlays import overlay

    image = Image.new("RGB", size, (90, 40, 200))
    pixels = to_tensor(image, size=32, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert pixels.shape == (3, 32, 32) and torch.isfinite(pixels).all()
    alpha = np.full((2, 2), 0.25, dtype=np.float32)
    assert overlay(image, alpha, "word").size == size


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


def test_a_tiff_cut_after_its_header_is_one_line_that_names_it_not_pillows_warning_too(tmp_path: Path) -> None:
    """Pillow warns "Corrupt EXIF data" in two lines of its own that name no file."""
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (10, 200, 30)).save(buffer, "TIFF")
    cut = tmp_path / "cut.tif"
    cut.write_bytes(buffer.getvalue()[:16])
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(ImageReadError, match=f"^{re.escape(str(cut))}: cannot read image"):
            load_image(cut)
    assert [str(w.message) for w in warned] == []


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


