"""Left-right mirroring of training pairs (`data.mirror`; not in the paper, off by default): the image
flipped horizontally and "left" and "right" swapped in its caption, so the caption stays true.

A plain horizontal flip, as image classifiers use, would make "a circle to the left of a square"
false; with the words swapped it is a second, equally true training pair. It teaches nothing about
"above" and "below", and it assumes what is drawn looks the same mirrored: true of the shapes data
(circles, squares, upright triangles and diamonds) and of most COCO scenes, not of text or clocks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from PIL import Image, ImageOps
from torch.utils.data import Dataset

MIRRORED_WORDS = {"left": "right", "right": "left", "leftmost": "rightmost", "rightmost": "leftmost"}


def mirror_image(image: Image.Image) -> Image.Image:
    return ImageOps.mirror(image)


def mirror_words(words: Sequence[str]) -> list[str]:
    """The caption of the mirrored image: ["a", "circle", "to", "the", "left", ...] -> [..., "right", ...].
    The Treebank tokenizer keeps a hyphenated word whole: its parts are swapped too ("left-hand",
    "left/right"). Only whole words and parts: "leftover" and "bright" stay as they are."""
    return [MIRRORED_WORDS.get(word) or re.sub(r"[^-/]+", lambda part: MIRRORED_WORDS.get(part[0], part[0]), word)
            for word in words]


def mirror_batches(batches: list[list[int]], *, pairs: int, seed: int, epoch: int) -> list[list[int]]:
    """Each pair index i in [0, pairs) becomes its mirrored copy i + pairs on a fair coin.

    The coins are a pure function of (seed, epoch), like the batches themselves (dataset.py), so a
    resumed run sees the same mirrored pairs as an uninterrupted one. One draw per pair, not per
    position in the batches, so the choice does not depend on how the epoch was cut.
    """
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch + 50_021)  # not the order's stream
    heads = (torch.rand(pairs, generator=generator) < 0.5).tolist()  # [pairs]
    return [[i + pairs if heads[i] else i for i in batch] for batch in batches]


class MirroredPairs(Dataset):
    """The training pairs and their mirrors: item i < P is pair i, item i + P the same pair mirrored
    (the image flipped, "left" and "right" swapped), P = len(pairs).

    `lengths` lists the P pairs only: the epoch is cut from them, then each index is turned into its
    mirror on a coin (mirror_batches). Swapping a word keeps a caption's length.
    """

    def __init__(self, pairs: Dataset, mirrored: Dataset):
        if len(pairs) != len(mirrored):
            raise ValueError(f"{len(pairs)} pairs but {len(mirrored)} mirrored pairs")
        self.pairs, self.mirrored = pairs, mirrored

    @property
    def lengths(self) -> list[int]:
        return self.pairs.lengths

    def __len__(self) -> int:
        return 2 * len(self.pairs)

    def __getitem__(self, index: int):
        return self.pairs[index] if index < len(self.pairs) else self.mirrored[index - len(self.pairs)]
