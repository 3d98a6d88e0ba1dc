"""The feature cache each config needs: grid cells x channels x 2 bytes (fp16) x its dataset's images.

    python benchmarks/cache_sizes.py

Each config's encoder is built as its config says (name, layer, input size, padding) with random
weights handed over as `encoder.weights_path` (the sizes do not depend on the weights), and run
once on a blank image for its grid and channels. The images of each dataset's three splits, which
`captioning prepare-features` caches: COCO's Karpathy splits, 113 287 training images (restval
included), 5 000 validation and 5 000 test, 123 287 in all; Flickr8k's Karpathy splits, 6 000 +
1 000 + 1 000; the shapes data's 4 000 + 500 + 500.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from dry_runs import random_weights

from captioning.config import load_config
from captioning.model.encoder import Encoder

REPO = Path(__file__).resolve().parents[1]
IMAGES = {"coco_vgg19_soft": 123_287, "coco_resnet101_soft": 123_287, "flickr8k_vgg19_soft": 8_000,
          "shapes_soft": 5_000}  # config -> the images of its dataset's three splits


def cache_bytes(config_name: str, images: int, folder: Path) -> tuple[int, int, int, int]:
    """(input side, grid cells L, channels D, bytes for `images` images) of one config's encoder."""
    config = load_config(REPO / "configs" / f"{config_name}.yaml")
    weights = None if config.encoder.name == "efficientnet_lite0" else random_weights(config.encoder.name, folder)
    settings = config.encoder
    if weights is not None:
        settings.weights_path = str(weights)
    encoder = Encoder.from_config(settings).eval()
    side = config.data.image_size
    with torch.no_grad():
        blank, _ = encoder(torch.zeros(1, 3, side, side))  # [1, L, D]
    return side, blank.shape[1], blank.shape[2], images * blank.shape[1] * blank.shape[2] * 2


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print("| config | encoder | input | grid x channels | per image | images | cache |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, images in IMAGES.items():
            config = load_config(REPO / "configs" / f"{name}.yaml")
            side, cells, channels, total = cache_bytes(name, images, Path(folder))
            print(f"| {name} | {config.encoder.name} {config.encoder.layer} | {side}² | {cells} x {channels} | "
                  f"{cells * channels * 2 / 1e3:.1f} kB | {images:,} | {total / 1e9:.2f} GB |")


if __name__ == "__main__":
    main()
