"""Attention correctness (Liu et al., 2017, "Attention Correctness in Neural Image Captioning"): for
a generated word that names an object, the share of its attention map, upsampled to the image and
normalized, that falls inside that object's region: its box (the shapes data), or the union of its
category's instance masks (COCO). Its chance level is the same for a uniform map, i.e. the region's
share of the centre square that the encoder saw.

Which words name which objects is the dataset's to say (captioning.eval.shapes.scorer for the
shapes data, captioning.eval.coco.scorer for COCO); this module holds the geometry.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from captioning.data.images import attention_on_image


def box_mass(alpha: np.ndarray, box: Sequence[float], *, width: int, height: int) -> float:
    """Share of an attention map [Hg, Wg], drawn on a width x height image, inside box (x0, y0, x1, y1)."""
    heat = attention_on_image(alpha, width=width, height=height)  # [height, width]
    heat = np.clip(heat, 0, None)
    x0, y0, x1, y1 = box
    ys, xs = np.mgrid[0:height, 0:width] + 0.5  # pixel centres
    inside = (xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)
    return float(heat[inside].sum() / heat.sum())


def box_share(box: Sequence[float], *, width: int, height: int) -> float:
    """The chance level: what a uniform map puts inside the box (the crop is the whole square image)."""
    return box_mass(np.ones((1, 1)), box, width=width, height=height)


def mask_mass(alpha: np.ndarray, mask: np.ndarray) -> float:
    """Share of an attention map [Hg, Wg], drawn on the image as the encoder saw it (its centre
    square, data/images.attention_on_image), inside a mask [height, width] bool of that image."""
    height, width = mask.shape
    heat = np.clip(attention_on_image(alpha, width=width, height=height), 0, None)  # [height, width]
    return float(heat[mask].sum() / heat.sum())


def mask_share(mask: np.ndarray) -> float:
    """The chance level: what a uniform map over the centre square puts inside the mask, i.e. the
    mask's share of that square (not of the whole image: the encoder never saw the rest)."""
    return mask_mass(np.ones((1, 1)), mask)
