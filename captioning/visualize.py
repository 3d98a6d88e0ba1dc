"""Per-word attention overlays, as in the paper's figures: the map behind each word, drawn over the
original image (not the encoder's resized crop), smoothed, colour-mapped and blended."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from captioning.data.images import attention_on_image, crop_box


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


def _label(image: Image.Image, text: str) -> Image.Image:
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=max(12, image.height // 14))
    left, top, right, bottom = draw.textbbox((4, 4), text, font=font)
    draw.rectangle((0, 0, right + 4, bottom + 4), fill=(0, 0, 0))
    draw.text((4, 4), text, fill=(255, 255, 255), font=font)
    return image


def overlay(image: Image.Image, alpha: np.ndarray, word: str, *, opacity: float = 0.55) -> Image.Image:
    """One word's map over the RGB image, with the word written on it."""
    heat = heatmap(alpha, width=image.width, height=image.height)
    colours = Image.fromarray(np.uint8(colormaps["jet"](heat)[..., :3] * 255))
    return _label(Image.blend(image, colours, opacity), word)


def _safe(word: str) -> str:
    return re.sub(r"[^\w-]", "_", word) or "_"


def overlay_grid(image: Image.Image, words: Sequence[str], alphas: np.ndarray, *, thumbnail: int = 224,
                 columns: int = 5) -> Image.Image:
    """The image and one overlay per word, as thumbnails in rows of `columns`; alphas [n, Hg, Wg]."""
    tiles = [_label(image.copy(), "image"), *(overlay(image, alpha, word) for word, alpha in zip(words, alphas))]
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
                  thumbnail: int = 224, columns: int = 5) -> list[Path]:
    """One PNG per word (NN_word.png) and grid.png with the image and every word; alphas [n, Hg, Wg]."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, tiles = [], [_label(image.copy(), "image")]
    for position, (word, alpha) in enumerate(zip(words, alphas)):
        picture = overlay(image, alpha, word)
        path = out_dir / f"{position:02d}_{_safe(word)}.png"
        picture.save(path)
        paths.append(path)
        tiles.append(picture)
    _tile(image, tiles, thumbnail=thumbnail, columns=columns).save(out_dir / "grid.png")
    return [*paths, out_dir / "grid.png"]
