"""Real photos to try a model on, from scikit-image's bundled data (public domain, shipped inside the
package, so no download): an astronaut, a cat, a cup of coffee, a motorcycle and a rocket."""

from __future__ import annotations

from pathlib import Path

from captioning.data.records import DatasetError

# name -> how skimage.data gives it (stereo_motorcycle is a pair and its disparity: the left photo)
SAMPLE_PHOTOS = ("astronaut", "chelsea", "coffee", "motorcycle", "rocket")


def sample_photo(name: str):
    """One of SAMPLE_PHOTOS as a PIL image."""
    try:
        from skimage import data
    except ImportError as error:
        raise DatasetError("the sample photos come from scikit-image: pip install scikit-image") from error
    from PIL import Image

    if name not in SAMPLE_PHOTOS:
        raise DatasetError(f"unknown sample photo '{name}' (known: {', '.join(SAMPLE_PHOTOS)})")
    pixels = data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(data, name)()
    return Image.fromarray(pixels)


def write_sample_photos(out: str | Path, names: tuple[str, ...] = SAMPLE_PHOTOS) -> list[Path]:
    """OUT/NAME.png for each photo (lossless: the file holds the pixels a model is tested on); the
    paths, in order."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = out / f"{name}.png"
        sample_photo(name).convert("RGB").save(path)
        paths.append(path)
    return paths
