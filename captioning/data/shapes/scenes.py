"""The synthetic "shapes" dataset: coloured shapes at known places, with captions that name them.

Every image holds 1-3 non-overlapping shapes on a light textured background and comes with five
varied captions; where there are two or more shapes, some captions state a spatial relation
between two of them. Because every object's box is known and every caption word that names an
object is linked to it, attention maps can be scored (does the map for "circle" fall on the
circle?) and generated relations can be checked against the image.

Written in the formats real data comes in, so the general loaders read it unchanged:
  DIR/images/<split>/<split>_NNNNN.png
  DIR/captions_<split>.json     COCO captions format
  DIR/dataset_shapes.json       Karpathy-style split file
  DIR/objects.json              per image: object boxes, and caption word -> object links
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from captioning.data.shapes.destination import DATASET, PHOTOS, refuse_foreign
from captioning.data.vocab import tokenize

SHAPES = ("circle", "square", "triangle", "diamond")
COLOURS = {
    "red": (215, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
    "purple": (140, 50, 170),
}
SIZES = {"small": 0.075, "large": 0.14}  # radius as a share of the image side
RELATIONS = ("to the left of", "to the right of", "above", "below")
INVERSE = dict(zip(RELATIONS, ("to the right of", "to the left of", "below", "above")))
NUMBERS = {2: "two", 3: "three"}
SPLITS = ("train", "val", "test")
Caption = list[tuple[str, int | None]]  # words, each with the index of the object it names (or None)


@dataclass
class ShapeObject:
    shape: str
    colour: str
    size: str
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels

    @property
    def centre(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return (x0 + x1) / 2, (y0 + y1) / 2


def relation(a: ShapeObject, b: ShapeObject) -> str:
    """The relation that holds of a with respect to b, along the axis where they differ most."""
    (ax, ay), (bx, by) = a.centre, b.centre
    if abs(bx - ax) >= abs(by - ay):
        return "to the left of" if ax < bx else "to the right of"
    return "above" if ay < by else "below"


def _region(obj: ShapeObject, image_size: int) -> str:
    x, y = obj.centre
    row = ("top", "middle", "bottom")[min(int(3 * y / image_size), 2)]
    column = ("left", "centre", "right")[min(int(3 * x / image_size), 2)]
    if row == "middle" and column == "centre":
        return "in the centre"
    if row == "middle":
        return f"on the {column}"
    if column == "centre":
        return f"at the {row}"
    return f"in the {row} {column}"


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    """Light paper-like texture: a tint, a soft gradient, faint stripes and pixel noise."""
    tint = rng.uniform(222, 248, size=3)
    ys, xs = np.mgrid[0:size, 0:size] / size
    angle = rng.uniform(0, math.pi)
    stripes = 4.0 * np.sin(2 * math.pi * rng.uniform(6, 14) * (xs * math.cos(angle) + ys * math.sin(angle)))
    gradient = rng.uniform(-8, 8) * xs + rng.uniform(-8, 8) * ys
    noise = rng.normal(0, 4.0, size=(size, size, 3))
    pixels = tint + (stripes + gradient)[..., None] + noise
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if shape == "square":
        s = r * 0.85
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if shape == "triangle":
        return [(cx, cy - r), (cx + r * 0.95, cy + r * 0.8), (cx - r * 0.95, cy + r * 0.8)]
    if shape == "diamond":
        return [(cx, cy - r), (cx + r * 0.8, cy), (cx, cy + r), (cx - r * 0.8, cy)]
    raise ValueError(shape)


def _place_objects(rng: np.random.Generator, size: int,
                   object_weights: tuple[float, float, float] | None = None) -> list[ShapeObject]:
    if object_weights is None:
        count = int(rng.integers(1, 4))
    else:
        count = 1 + int(rng.choice(3, p=np.asarray(object_weights, dtype=float) / sum(object_weights)))
    kinds = [(s, c) for s in SHAPES for c in COLOURS]
    chosen = rng.choice(len(kinds), size=count, replace=False)  # each (shape, colour) at most once
    objects: list[ShapeObject] = []
    for k in chosen:
        shape, colour = kinds[int(k)]
        for _ in range(200):  # rejection sampling for a place that overlaps nothing
            size_word = str(rng.choice(list(SIZES)))
            r = SIZES[size_word] * size * rng.uniform(0.9, 1.1)
            margin = r + 0.03 * size
            cx, cy = (float(v) for v in rng.uniform(margin, size - margin, size=2))
            box = (cx - r, cy - r, cx + r, cy + r)
            gap = 0.04 * size
            if all(box[0] > o.box[2] + gap or box[2] < o.box[0] - gap or box[1] > o.box[3] + gap
                   or box[3] < o.box[1] - gap for o in objects):
                objects.append(ShapeObject(shape, colour, size_word, box))
                break
    return objects


def _draw(rng: np.random.Generator, objects: list[ShapeObject], size: int) -> Image.Image:
    scale = 2  # draw large and shrink, for smooth edges
    canvas = _background(rng, size).resize((size * scale, size * scale), Image.NEAREST)
    draw = ImageDraw.Draw(canvas)
    for obj in objects:
        jitter = rng.integers(-18, 19, size=3)
        fill = tuple(int(np.clip(v + j, 0, 255)) for v, j in zip(COLOURS[obj.colour], jitter))
        cx, cy = (c * scale for c in obj.centre)
        r = (obj.box[2] - obj.box[0]) / 2 * scale
        if obj.shape == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        else:
            draw.polygon(_polygon(obj.shape, cx, cy, r), fill=fill)
    return canvas.resize((size, size), Image.LANCZOS).filter(ImageFilter.SMOOTH)


def _phrase(obj: ShapeObject, index: int, with_size: bool) -> Caption:
    """'a small red circle' as (word, object index or None) pairs."""
    words: Caption = [("a", None)]
    if with_size:
        words.append((obj.size, index))
    return words + [(obj.colour, index), (obj.shape, index)]


def _words(text: str) -> Caption:
    return [(word, None) for word in text.split()]


def _captions(rng: np.random.Generator, objects: list[ShapeObject], size: int) -> list[Caption]:
    """Five captions, each a list of (word, linked object index or None)."""
    n = len(objects)
    if n == 1:
        obj = objects[0]
        return [
            _phrase(obj, 0, True),
            _phrase(obj, 0, False),
            _words("there is") + _phrase(obj, 0, True),
            _phrase(obj, 0, True) + _words("on a light background"),
            _phrase(obj, 0, False) + _words(_region(obj, size)),
        ]
    order = [int(i) for i in rng.permutation(n)]
    captions = []
    for k in range(3):  # relations between a pair, in both directions
        i, j = (order[k % n], order[(k + 1) % n])
        rel = relation(objects[i], objects[j])
        if k == 2:
            i, j, rel = j, i, INVERSE[rel]
        captions.append(_phrase(objects[i], i, k == 0) + _words(rel) + _phrase(objects[j], j, k == 0))
    listing: Caption = []
    for position, i in enumerate(sorted(range(n), key=lambda i: objects[i].centre[0])):
        if position:
            listing += _words("and")
        listing += _phrase(objects[i], i, False)
    captions.append(listing)
    captions.append(_words(f"{NUMBERS[n]} shapes") + listing)
    return captions


def generate_image(seed: int, split: str, index: int, image_size: int,
                   object_weights: tuple[float, float, float] | None = None,
                   ) -> tuple[Image.Image, list[ShapeObject], list[Caption]]:
    """One image, its objects and its captions; a function of (seed, split, index) alone, and of
    `object_weights` (the relative odds of 1, 2 and 3 objects) where given: None draws the count
    uniformly."""
    rng = np.random.default_rng([seed, SPLITS.index(split), index])
    objects = _place_objects(rng, image_size, object_weights)
    image = _draw(rng, objects, image_size)
    return image, objects, _captions(rng, objects, image_size)


def make_shapes(out: str | Path, counts: dict[str, int], seed: int = 0, image_size: int = 224,
                train_object_weights: tuple[float, float, float] | None = None) -> Path:
    """Writes the dataset under `out` and returns the path of its Karpathy-style split file. `out`
    is new, empty, or holds what this writes there (destination.py); anything else is DatasetError.

    `train_object_weights` gives the training images another mix of 1, 2 and 3 objects (relative
    odds, e.g. (1, 2, 3)); the validation and test images stay those of the uniform draw, byte for
    byte, so that runs trained on either mix are scored on the same images."""
    if train_object_weights is not None and (
            len(train_object_weights) != 3 or not all(math.isfinite(w) and w >= 0 for w in train_object_weights)
            or not sum(train_object_weights) > 0):
        raise ValueError(f"train_object_weights: three non-negative odds for 1, 2 and 3 objects, not all zero; "
                         f"got {train_object_weights}")
    out = Path(out)
    refuse_foreign(out, DATASET, what="the shapes data")
    karpathy_images = []
    objects_file: dict[str, dict] = {}
    image_id = sentence_id = 0
    for split in SPLITS:
        folder = out / "images" / split
        folder.mkdir(parents=True, exist_ok=True)
        mix = (", 1 / 2 / 3 objects at odds " + ":".join(f"{w:g}" for w in train_object_weights)
               if split == "train" and train_object_weights else "")
        coco = {"info": {"description": f"shapes {split}, seed {seed}{mix}"}, "images": [], "annotations": []}
        for index in range(counts.get(split, 0)):
            image, objects, captions = generate_image(seed, split, index, image_size,
                                                      train_object_weights if split == "train" else None)
            filename = f"{split}_{index:05d}.png"
            image.save(folder / filename, compress_level=1)
            coco["images"].append({"id": image_id, "file_name": filename, "width": image_size, "height": image_size})
            sentences, links = [], []
            for caption in captions:
                raw = " ".join(word for word, _ in caption)
                assert tokenize(raw) == [word for word, _ in caption]  # word indices stay valid
                coco["annotations"].append({"id": sentence_id, "image_id": image_id, "caption": raw})
                sentences.append({"raw": raw, "tokens": tokenize(raw), "imgid": image_id, "sentid": sentence_id})
                links.append([[w, o] for w, (_, o) in enumerate(caption) if o is not None])
                sentence_id += 1
            karpathy_images.append({
                "filepath": f"images/{split}", "filename": filename, "imgid": image_id, "cocoid": image_id,
                "split": split, "sentences": sentences,
            })
            objects_file[str(image_id)] = {
                "objects": [{**asdict(o), "box": [round(v, 2) for v in o.box]} for o in objects],
                "links": links,
            }
            image_id += 1
        (out / f"captions_{split}.json").write_text(json.dumps(coco))
    split_file = out / "dataset_shapes.json"
    split_file.write_text(json.dumps({"dataset": "shapes", "images": karpathy_images}))
    (out / "objects.json").write_text(json.dumps({"image_size": image_size, "images": objects_file}))
    return split_file


def write_folder(out: str | Path, images: int, *, seed: int = 0, image_size: int = 224) -> Path:
    """`images` scenes as a folder of your own photos would come (docs/data.md): out/images/*.jpg and
    out/captions.csv, a row per caption (image, caption) and no splits. Returns the captions file.
    `out` is new, empty, or holds what this writes there (destination.py); anything else is DatasetError."""
    out = Path(out)
    refuse_foreign(out, PHOTOS, what="shapes photos")
    folder = out / "images"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(images):
        image, _, captions = generate_image(seed, "train", index, image_size)
        name = f"scene_{index:05d}.jpg"
        image.save(folder / name, quality=90)
        rows += [(name, " ".join(word for word, _ in caption)) for caption in captions]
    captions_file = out / "captions.csv"
    with captions_file.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["image", "caption"])
        writer.writerows(rows)
    return captions_file


@dataclass
class SceneObjects:
    """Ground truth of one image for scoring attention: its objects and its size."""

    objects: list[ShapeObject]
    width: int
    height: int



def read_scene_objects(path: str | Path, image_ids: list[int]) -> list[SceneObjects]:
    """The objects of each image, in the order of image_ids, from a shapes objects.json."""
    data = json.loads(Path(path).read_text())
    side = int(data["image_size"])
    return [SceneObjects([ShapeObject(o["shape"], o["colour"], o["size"], tuple(o["box"]))
                       for o in data["images"][str(i)]["objects"]], side, side) for i in image_ids]
