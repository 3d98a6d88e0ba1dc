"""Reading images and turning them into encoder input, keeping track of where the input came from;
many files at once as a Dataset that DataLoader workers read (ImageFiles, collate_pixels), for the
feature cache and for captioning a folder.

The encoder sees a square crop: the shorter side is resized to S and the centre S x S is kept. The
crop box, in the original image's pixels, lets an attention map be drawn back onto the original.
Below: what an image file holds, as the digest of its bytes (`file_digest`), and scikit-image's
sample photos (`write_sample_photos`).
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch.utils.data import Dataset
from tqdm import tqdm

from captioning.data.records import DatasetError, ImageRecord

# The files a folder's images are: what `caption` finds in a folder, and what a folder dataset's report
# counts as an image no caption names.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def is_image_file(path: Path) -> bool:
    """A file a folder's images include: named with one of IMAGE_SUFFIXES, in any case."""
    return path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()


class ImageReadError(ValueError):
    """An image file that is missing or cannot be decoded."""


def load_image(path: str | Path) -> Image.Image:
    """The picture in a file as 8-bit RGB, upright, as a photo viewer shows it.

    Turned by its EXIF orientation (a phone photo taken upright is stored sideways with a tag);
    transparent pixels over white; 16-bit and 32-bit grayscale scaled to 8 bits; an animated image's
    first frame. Anything that is not a readable image (missing, empty, a folder, no permission,
    truncated, corrupt, a decompression bomb) raises ImageReadError with the path and the problem.
    """
    path = Path(path)
    if path.is_dir():
        raise ImageReadError(f"{path}: is a folder, not an image")
    try:
        if path.stat().st_size == 0:
            raise ImageReadError(f"{path}: empty file")
        # Pillow warns of a damaged header (Corrupt EXIF data...) in two lines that name no file; what
        # matters of the file is said below, in one line that names it, or it is read after all.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.")
            with Image.open(path) as image:
                image.load()  # the first frame of an animated GIF, PNG or WebP
                return upright_rgb(image)
    except ImageReadError:
        raise
    except FileNotFoundError as error:
        raise ImageReadError(f"{path}: no such file") from error
    except PermissionError as error:
        raise ImageReadError(f"{path}: permission denied") from error
    except Image.DecompressionBombError as error:  # a header that claims more pixels than Pillow allows
        raise ImageReadError(f"{path}: too large to decode safely ({error})") from error
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, struct.error) as error:
        raise ImageReadError(f"{path}: cannot read image ({error})") from error
    except Exception as error:  # noqa: BLE001 - Pillow's decoders meet crafted files with any error
        # (IndexError, TypeError, ZeroDivisionError...): one bad file must not stop a folder.
        raise ImageReadError(f"{path}: cannot read image ({error.__class__.__name__}: {error})") from error


def upright_rgb(image: Image.Image) -> Image.Image:
    """A loaded PIL image as load_image returns a file's: turned by its EXIF orientation, 8-bit RGB,
    transparency over white."""
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16/32-bit grayscale: scale, don't clip
        array = np.asarray(image, dtype=np.float64)
        if image.mode.startswith("I;16"):  # 16 bits say their scale: a dark photo stays dark
            top = 65535.0
        elif image.mode == "F" and array.max() <= 1.0:  # floats in [0, 1], as scientific images store them
            top = 1.0
        else:  # 32 bits that do not say their scale: 8 or 16 bits' by the brightest pixel
            top = 65535.0 if array.max() > 255 else 255.0
        image = Image.fromarray((np.clip(array, 0, top) / top * 255).round().astype(np.uint8))
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def augment(image: Image.Image, *, generator: torch.Generator | None = None, min_scale: float = 0.8,
            jitter: float = 0.2) -> Image.Image:
    """A training-time variant of an RGB image: a random square crop and colour jitter.

    The crop's side is a random share in [min_scale, 1] of the shorter side, at a random place, so
    the encoder (which keeps the centre square, see `crop_box`) sees the whole crop. Brightness,
    contrast and saturation are each scaled by a random factor in [1 - jitter, 1 + jitter]. No
    horizontal flip: captions name left and right (data.mirror flips and swaps those words).
    """
    from torchvision.transforms import functional as TF

    def uniform(low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=generator))

    width, height = image.size
    side = round(min(width, height) * uniform(min_scale, 1.0))  # whole pixels, so the crop stays square
    x0, y0 = round(uniform(0, width - side)), round(uniform(0, height - side))
    image = image.crop((x0, y0, x0 + side, y0 + side))
    image = TF.adjust_brightness(image, uniform(1 - jitter, 1 + jitter))
    image = TF.adjust_contrast(image, uniform(1 - jitter, 1 + jitter))
    return TF.adjust_saturation(image, uniform(1 - jitter, 1 + jitter))


def crop_box(width: int, height: int) -> tuple[float, float, float, float]:
    """The centred square (x0, y0, x1, y1) that a resize-shorter-side + centre-crop keeps."""
    side = min(width, height)
    x0, y0 = (width - side) / 2, (height - side) / 2
    return x0, y0, x0 + side, y0 + side


def to_tensor(image: Image.Image, *, size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """RGB image -> normalized [3, size, size] float tensor of its centre square."""
    image = image.resize((size, size), Image.BICUBIC, box=crop_box(*image.size), reducing_gap=None)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)  # [3, S, S]
    return (pixels - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]


def attention_on_image(alpha: np.ndarray, *, width: int, height: int) -> np.ndarray:
    """An attention map [Hg, Wg] over the encoder's input, drawn onto the original image: [height, width].

    Upsampled bilinearly over the centre square that the encoder saw (see `crop_box`); zero outside it.
    """
    side = min(width, height)  # whole pixels, so that an odd margin never leaves an empty square
    x0, y0 = (width - side) // 2, (height - side) // 2
    x1, y1 = x0 + side, y0 + side
    grid = torch.as_tensor(np.asarray(alpha, dtype=np.float32))[None, None]  # [1, 1, Hg, Wg]
    square = torch.nn.functional.interpolate(grid, size=(y1 - y0, x1 - x0), mode="bilinear", align_corners=False)
    heat = np.zeros((height, width), dtype=np.float32)
    heat[y0:y1, x0:x1] = square[0, 0].numpy()
    return heat


# Many files: read in DataLoader workers, batched for the encoder ------------------------------------

class ImageFiles(Dataset):
    """Normalized encoder input for a list of image records: (row, pixels [3, S, S] or None, error).

    Decoding happens here, in the DataLoader workers; each call opens and closes its own file, so
    no handle is shared across processes. An unreadable image gives None and the reason instead
    of killing the whole run. `transform` changes each image first (data/flips.py flips it).
    """

    def __init__(self, records: list[ImageRecord], *, size: int, mean: tuple[float, ...], std: tuple[float, ...],
                 first: int = 0, transform: Callable[[Image.Image], Image.Image] | None = None):
        self.records, self.size, self.mean, self.std, self.first = records, size, mean, std, first
        self.transform = transform

    def __len__(self) -> int:
        return len(self.records) - self.first

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | None, str | None]:
        row = self.first + index
        try:
            image = load_image(self.records[row].path)
        except ImageReadError as error:
            return row, None, str(error)
        if self.transform is not None:
            image = self.transform(image)
        return row, to_tensor(image, size=self.size, mean=self.mean, std=self.std), None


class PixelBatch(NamedTuple):
    rows: list[int]  # the readable images' positions in the record list
    pixels: torch.Tensor | None  # [b, 3, S, S], None when no image of the batch could be read
    failures: list[tuple[int, str]]  # (row, reason) of each unreadable image


def collate_pixels(items: list[tuple[int, torch.Tensor | None, str | None]]) -> PixelBatch:
    readable = [(row, pixels) for row, pixels, _ in items if pixels is not None]
    return PixelBatch(rows=[row for row, _ in readable],
                      pixels=torch.stack([p for _, p in readable]) if readable else None,
                      failures=[(row, error) for row, _, error in items if error is not None])


def warn_unreadable(reason: str) -> None:
    tqdm.write(f"warning: skipping an unreadable image: {reason}", file=sys.stderr)


class Resolver:
    """os.path.realpath for many files, each folder resolved once for all the files in it (a
    realpath per file took half the time of reading 200 000 captions rows): then only a link in a
    file's last part is followed."""

    def __init__(self):
        self.folders: dict[str, str] = {}  # a folder as spelled -> resolved: a collection has few

    def __call__(self, spelled: str | Path) -> str:
        folder, name = os.path.split(os.fspath(spelled))
        if name in ("", ".", ".."):
            return os.path.realpath(spelled)
        if folder not in self.folders:
            self.folders[folder] = os.path.realpath(folder)
        path = os.path.join(self.folders[folder], name)
        return os.path.realpath(path) if os.path.islink(path) else path


# what an image file holds: its digest -------------------------------------------------------------
# What an image file holds, as a digest of its bytes: the identity that survives a move, a rename or a
# copy (a path does not), and that changes when the picture does (a name does not).
#
# The splits record (data/kept_splits.py) keeps each image's digest beside its path, so that a photo
# moved into another folder keeps its split; the feature cache (data/features.py) keeps each row's, so
# that a dataset copied or moved is not encoded again and an image replaced under its own name is; a
# checkpoint's record (train/provenance.py) keeps one per split, so that `captioning verify` can tell
# changed images from the hardware. SHA-256 runs at about 2 GB/s on one core, so a file is hashed
# when it is new or its size or modification time changed, never at every read (docs/reliability.md
# gives the cost at COCO's size).

DIGEST_CHARS = 32  # 128 bits of SHA-256: no two of a few million photos share one by chance


def file_digest(path: str | Path) -> str | None:
    """The digest of a file's bytes, or None where it cannot be read (missing, a folder, no permission)."""
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()[:DIGEST_CHARS]
    except OSError:
        return None


def file_stat(path: str | Path) -> tuple[int, int] | None:
    """(size, modification time in ns) of a file, None where it cannot be seen: what says, without
    reading it, that a file is as it was when its digest was taken."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns


def contents_of(paths: Sequence[str | Path], known: Sequence[str | None] | None = None) -> list[str | None]:
    """Each file's digest: `known` where a feature cache already took them, else hashed here."""
    return list(known) if known is not None else [file_digest(path) for path in paths]


def split_digest(contents: Sequence[str | None]) -> str:
    """16 hex digits for a split's images' contents in their order (a missing file counts as "-")."""
    hashed = hashlib.sha256()
    for digest in contents:
        hashed.update(f"{digest or '-'}\n".encode())
    return hashed.hexdigest()[:16]


# scikit-image's sample photos ---------------------------------------------------------------------
# Real photos to try a model on, from scikit-image's bundled data (public domain, shipped inside the
# package, so no download): an astronaut, a cat, a cup of coffee, a motorcycle and a rocket.

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
