"""Overlays: attention maps are drawn where the encoder looked, on the original (non-square) image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioning.data.images import attention_on_image
from captioning.eval.overlays import heatmap, overlay, overlay_grid, save_overlays

GRID = 14
CELLS = [(0, 0), (0, 13), (13, 0), (13, 13), (6, 7), (3, 10)]


def _one_hot(row: int, column: int, grid: int = GRID) -> np.ndarray:
    alpha = np.zeros((grid, grid), dtype=np.float32)
    alpha[row, column] = 1.0
    return alpha


def _cell_region(row: int, column: int, width: int, height: int) -> tuple[float, float, float, float]:
    """A grid cell in original-image pixels: the grid covers the centred square crop."""
    side = min(width, height)
    x0, y0 = (width - side) / 2, (height - side) / 2
    cell = side / GRID
    return x0 + column * cell, y0 + row * cell, x0 + (column + 1) * cell, y0 + (row + 1) * cell


@pytest.mark.parametrize("size", [(300, 200), (200, 300), (224, 224)], ids=["wide", "tall", "square"])
@pytest.mark.parametrize("cell", CELLS, ids=[f"r{r}c{c}" for r, c in CELLS])
def test_heatmap_peak_lies_in_the_attended_cell(size: tuple[int, int], cell: tuple[int, int]) -> None:
    width, height = size
    heat = heatmap(_one_hot(*cell), width=width, height=height)
    assert heat.shape == (height, width)
    assert heat.min() >= 0.0 and heat.max() == pytest.approx(1.0)
    y, x = np.unravel_index(int(np.argmax(heat)), heat.shape)
    x0, y0, x1, y1 = _cell_region(*cell, width, height)
    assert x0 <= x + 0.5 <= x1 and y0 <= y + 0.5 <= y1, ((x, y), (x0, y0, x1, y1))


def test_heatmap_of_a_wide_image_is_zero_outside_the_crop() -> None:
    heat = heatmap(_one_hot(6, 7), width=300, height=200)
    assert np.all(heat[:, :50] == 0) and np.all(heat[:, 250:] == 0)
    assert heat[:, 50:250].max() == pytest.approx(1.0)
    tall = heatmap(_one_hot(7, 6), width=200, height=300)
    assert np.all(tall[:50] == 0) and np.all(tall[250:] == 0)


def test_attention_on_image_keeps_the_mass_inside_the_crop() -> None:
    alpha = np.random.default_rng(0).random((GRID, GRID)).astype(np.float32)
    heat = attention_on_image(alpha, width=300, height=200)
    assert heat.shape == (200, 300)
    assert np.all(heat[:, :50] == 0) and np.all(heat[:, 250:] == 0)
    # Bilinear upsampling keeps the mean of the map over the 200x200 square.
    assert heat[:, 50:250].mean() == pytest.approx(alpha.mean(), rel=0.02)


def _picture(width: int, height: int) -> Image.Image:
    pixels = np.random.default_rng(1).integers(80, 200, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_overlay_keeps_the_original_size_and_colours_the_attended_cell() -> None:
    image = _picture(300, 200)
    centre = overlay(image, _one_hot(6, 7), "circle")
    corner = overlay(image, _one_hot(13, 13), "circle")
    assert centre.size == (300, 200) and centre.mode == "RGB"
    assert image.size == (300, 200)  # the input is left alone
    # jet puts red at the peak and dark blue at zero: the attended cell gets redder than when
    # the same cell is not attended.
    x0, y0, x1, y1 = (int(v) for v in _cell_region(6, 7, 300, 200))
    red_attended = np.asarray(centre, dtype=float)[y0:y1, x0:x1, 0].mean()
    red_elsewhere = np.asarray(corner, dtype=float)[y0:y1, x0:x1, 0].mean()
    assert red_attended > red_elsewhere + 30


def test_save_overlays_writes_one_png_per_word_and_a_grid(tmp_path: Path) -> None:
    image = _picture(300, 200)
    words = ["a", "red", "<unk>"]
    alphas = np.stack([_one_hot(2, 3), _one_hot(7, 7), _one_hot(13, 1)])
    paths = save_overlays(image, words, alphas, tmp_path / "out")
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["00_a.jpg", "01_red.jpg", "02__unk_.jpg", "grid.jpg", "image.jpg"]
    assert sorted(p.name for p in paths) == names and all(p.is_file() for p in paths)
    for path in [*paths[:3], tmp_path / "out" / "image.jpg"]:
        with Image.open(path) as picture:
            assert picture.size == (300, 200)
    with Image.open(tmp_path / "out" / "grid.jpg") as grid:
        grid.load()
        assert grid.width > grid.height  # four tiles (the image and three words) in a row
        assert grid.size == (4 * 224, round(200 * 224 / 300))


def test_save_overlays_grid_wraps_rows(tmp_path: Path) -> None:
    image = _picture(100, 100)
    words = [f"w{i}" for i in range(7)]
    alphas = np.stack([_one_hot(i, i) for i in range(7)])
    save_overlays(image, words, alphas, tmp_path, thumbnail=50, columns=5)
    assert len(list(tmp_path.glob("0*_w*.jpg"))) == 7
    assert not (tmp_path / "words.gif").exists()  # only when asked
    with Image.open(tmp_path / "grid.jpg") as grid:
        assert grid.size == (5 * 50, 2 * 50)  # 8 tiles in rows of 5


@pytest.mark.parametrize("size", [(300, 200), (224, 224)], ids=["wide", "square"])
def test_overlay_outlines_hard_attentions_chosen_cell(size: tuple[int, int]) -> None:
    width, height = size
    image = _picture(width, height)
    alpha = np.full((GRID, GRID), 1.0 / GRID ** 2, dtype=np.float32)  # a flat map: the outline is all there is
    chosen = overlay(image, alpha, "circle", location=3 * GRID + 10)  # row 3, column 10
    plain = overlay(image, alpha, "circle")
    x0, y0, x1, y1 = (int(v) for v in _cell_region(3, 10, width, height))  # PIL draws from the floor
    pixels, before = np.asarray(chosen), np.asarray(plain)
    edge = pixels[y0 + 1, x0 + 3: x1 - 3]  # the top edge of the cell, inside the line width
    assert (edge == 255).all()  # white outline
    assert not (before[y0 + 1, x0 + 3: x1 - 3] == 255).all()
    far = _cell_region(12, 1, width, height)  # elsewhere the overlays agree
    fx, fy = round((far[0] + far[2]) / 2), round((far[1] + far[3]) / 2)
    assert (pixels[fy - 2: fy + 3, fx - 2: fx + 3] == before[fy - 2: fy + 3, fx - 2: fx + 3]).all()
    unchosen = overlay(image, alpha, "circle", location=-1)  # -1: the expectation, nothing chosen
    assert (np.asarray(unchosen) == before).all()


def test_save_overlays_passes_each_words_cell(tmp_path: Path) -> None:
    image = _picture(224, 224)
    alphas = np.stack([_one_hot(0, 0), _one_hot(5, 5)])
    save_overlays(image, ["a", "circle"], alphas, tmp_path / "hard", locations=[-1, 5 * GRID + 5])
    save_overlays(image, ["a", "circle"], alphas, tmp_path / "soft")
    first = [np.asarray(Image.open(tmp_path / kind / "00_a.jpg")) for kind in ("hard", "soft")]
    second = [np.asarray(Image.open(tmp_path / kind / "01_circle.jpg")) for kind in ("hard", "soft")]
    assert (first[0] == first[1]).all()  # no cell chosen for the first word
    assert not (second[0] == second[1]).all()  # the outline on the second


def test_overlay_grid_outlines_each_words_chosen_cell() -> None:
    image = _picture(224, 224)
    alphas = np.stack([_one_hot(0, 0), _one_hot(5, 5)])
    hard = np.asarray(overlay_grid(image, ["a", "circle"], alphas, thumbnail=224, locations=[-1, 5 * GRID + 5]))
    soft = np.asarray(overlay_grid(image, ["a", "circle"], alphas, thumbnail=224))
    assert (hard[:, : 2 * 224] == soft[:, : 2 * 224]).all()  # the image and the word without a chosen cell
    assert not (hard[:, 2 * 224:] == soft[:, 2 * 224:]).all()  # the outline on the second word's tile


def test_save_overlays_animation_has_a_frame_per_word(tmp_path: Path) -> None:
    image = _picture(120, 80)
    alphas = np.stack([_one_hot(i, 13 - i) for i in range(4)])
    save_overlays(image, ["w0", "w1", "w2", "w3"], alphas, tmp_path, animation=True)
    with Image.open(tmp_path / "words.gif") as gif:
        assert gif.n_frames == 4 and gif.size == (120, 80)


def test_a_words_label_draws_umlauts_and_sharp_s_as_letters_not_as_boxes() -> None:
    """Each letter is drawn as a glyph of its own: not the box a font draws for a character it lacks
    (a private-use code point, which no font maps), and not the same shape as its plain letter."""
    def label(word: str) -> np.ndarray:
        return np.asarray(overlay(Image.new("RGB", (224, 224)), _one_hot(0, 0), word))[:24, :40]

    missing = label("\ue000")
    for letter, plain in [("ä", "a"), ("ö", "o"), ("ü", "u"), ("ß", "s"), ("Ä", "A")]:
        drawn = label(letter)
        assert not np.array_equal(drawn, missing), letter
        assert not np.array_equal(drawn, label(plain)), letter
