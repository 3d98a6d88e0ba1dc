"""Per-word attention overlays, as in the paper's figures: the map behind each word, drawn over the
original image (not the encoder's resized crop), smoothed, colour-mapped and blended."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib import colormaps
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from captioning.data.images import attention_on_image, crop_box

CHOSEN = (255, 255, 255)  # outline of hard attention's chosen cell
JPEG_QUALITY = 90
# matplotlib's jet as a table of its 256 colours in 8 bits, looked up by the same bin matplotlib
# picks (floor(heat * 256)): the same pixels as colormaps["jet"](heat), at a quarter of the time.
_JET = np.uint8(colormaps["jet"](np.arange(256))[:, :3] * 255)


def heatmap(alpha: np.ndarray, *, width: int, height: int) -> np.ndarray:
    """An attention map [Hg, Wg] as a smooth [height, width] map in [0, 1] over the original image."""
    heat = attention_on_image(alpha, width=width, height=height)
    heat = np.clip(heat, 0, None) / max(float(heat.max()), 1e-12)
    # Blur by about a third of a grid cell: hides the bilinear creases, keeps the peak where it is.
    side = crop_box(width, height)[2] - crop_box(width, height)[0]
    radius = side / max(alpha.shape) / 3
    blurred = Image.fromarray(np.uint8(heat * 255)).filter(ImageFilter.GaussianBlur(radius))
    heat = np.asarray(blurred, dtype=np.float32)
    return heat / max(float(heat.max()), 1e-12)


# Words are labelled in DejaVu Sans, the font matplotlib ships: Latin with its accents and umlauts
# (ä, ß, é, ł), Greek and Cyrillic. Pillow's own default font draws a box for each of ä, ö, ü and ß.
LABEL_FONT = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


@functools.lru_cache(maxsize=8)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """The labels' font at `size`, read from disk once per size, not once per word; Pillow's default
    where matplotlib's font file is missing."""
    try:
        return ImageFont.truetype(LABEL_FONT, size=size)
    except OSError:
        return ImageFont.load_default(size=size)


def _label(image: Image.Image, text: str) -> Image.Image:
    draw = ImageDraw.Draw(image)
    font = _font(max(12, image.height // 14))
    left, top, right, bottom = draw.textbbox((4, 4), text, font=font)
    draw.rectangle((0, 0, right + 4, bottom + 4), fill=(0, 0, 0))
    draw.text((4, 4), text, fill=(255, 255, 255), font=font)
    return image


def cell_box(cell: int, grid: tuple[int, int], *, width: int, height: int) -> tuple[float, float, float, float]:
    """Grid cell `cell` (row-major) as a box (x0, y0, x1, y1) in the original image's pixels."""
    x0, y0, x1, y1 = crop_box(width, height)
    row, column = divmod(int(cell), grid[1])
    w, h = (x1 - x0) / grid[1], (y1 - y0) / grid[0]
    return x0 + column * w, y0 + row * h, x0 + (column + 1) * w, y0 + (row + 1) * h


def overlay(image: Image.Image, alpha: np.ndarray, word: str, *, opacity: float = 0.55,
            location: int | None = None) -> Image.Image:
    """One word's map over the RGB image, with the word written on it; `location` >= 0 (hard
    attention's chosen cell, row-major on alpha's grid) is outlined on top of the map."""
    heat = heatmap(alpha, width=image.width, height=image.height)
    colours = Image.fromarray(_JET[np.clip((heat * len(_JET)).astype(np.int64), 0, len(_JET) - 1)])
    picture = Image.blend(image, colours, opacity)
    if location is not None and location >= 0:
        box = cell_box(location, alpha.shape, width=image.width, height=image.height)
        line = max(2, round(min(image.size) / 100))
        ImageDraw.Draw(picture).rectangle(box, outline=CHOSEN, width=line)
    return _label(picture, word)


def _safe(word: str) -> str:
    return re.sub(r"[^\w-]", "_", word) or "_"


def word_file(position: int, word: str) -> str:
    """The file name of word `position`'s overlay: 00_a.jpg, 01_red.jpg, 02__unk_.jpg."""
    return f"{position:02d}_{_safe(word)}.jpg"


def overlay_grid(image: Image.Image, words: Sequence[str], alphas: np.ndarray, *, thumbnail: int = 224,
                 columns: int = 5, locations: Sequence[int] | None = None) -> Image.Image:
    """The image and one overlay per word, as thumbnails in rows of `columns`; alphas [n, Hg, Wg];
    `locations` (hard attention) the chosen cell of each word, outlined as in `overlay`."""
    cells = [None] * len(words) if locations is None else locations
    tiles = [_label(image.copy(), "image"),
             *(overlay(image, alpha, word, location=cell) for word, alpha, cell in zip(words, alphas, cells))]
    return _tile(image, tiles, thumbnail=thumbnail, columns=columns)


def _tile(image: Image.Image, tiles: list[Image.Image], *, thumbnail: int, columns: int) -> Image.Image:
    scale = thumbnail / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    rows = (len(tiles) + columns - 1) // columns
    grid = Image.new("RGB", (size[0] * min(columns, len(tiles)), size[1] * rows), (255, 255, 255))
    for i, tile in enumerate(tiles):
        grid.paste(tile.resize(size, Image.BILINEAR), ((i % columns) * size[0], (i // columns) * size[1]))
    return grid


def save_overlays(image: Image.Image, words: Sequence[str], alphas: np.ndarray, out_dir: str | Path, *,
                  locations: Sequence[int] | None = None, thumbnail: int = 224, columns: int = 5,
                  animation: bool = False) -> list[Path]:
    """One JPEG per word (NN_word.jpg), grid.jpg with the image and every word, the image itself
    (image.jpg, what a page shows before a word is picked) and, with `animation`, words.gif (a frame
    per word). alphas [n, Hg, Wg]; locations [n]: hard attention's chosen cell per word (-1: none),
    outlined over its map. JPEG because an overlay is a photograph: PNG took 100 ms to write one at
    640x480 and ten times the space (benchmarks/run.py --cases caption)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, tiles = [], [_label(image.copy(), "image")]
    for position, (word, alpha) in enumerate(zip(words, alphas)):
        picture = overlay(image, alpha, word, location=None if locations is None else int(locations[position]))
        path = out_dir / word_file(position, word)
        picture.save(path, quality=JPEG_QUALITY)
        paths.append(path)
        tiles.append(picture)
    _tile(image, tiles, thumbnail=thumbnail, columns=columns).save(out_dir / "grid.jpg", quality=JPEG_QUALITY)
    image.save(out_dir / "image.jpg", quality=JPEG_QUALITY)
    paths += [out_dir / "grid.jpg", out_dir / "image.jpg"]
    if animation and len(tiles) > 1:
        frames = [tile.copy() for tile in tiles[1:]]
        for frame in frames:
            frame.thumbnail((480, 480), Image.BILINEAR)
        frames[0].save(out_dir / "words.gif", save_all=True, append_images=frames[1:], duration=800, loop=0)
        paths.append(out_dir / "words.gif")
    return paths
