"""The synthetic shapes dataset: determinism, scene statistics, true captions, links and file formats."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioning.data.shapes.scenes import (
    COLOURS,
    RELATIONS,
    SHAPES,
    SIZES,
    ShapeObject,
    generate_image,
    make_shapes,
    relation,
)
from captioning.data.vocab import tokenize

COUNTS = {"train": 3, "val": 2, "test": 2}


@pytest.fixture(scope="module")
def generated() -> list[tuple[Image.Image, list[ShapeObject], list[list[tuple[str, int | None]]]]]:
    """~200 scenes straight from the generator (no files)."""
    return [generate_image(7, split, index, 96) for split in ("train", "val") for index in range(100)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shapes64")
    make_shapes(out, COUNTS, seed=5, image_size=64)
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_files_and_another_seed_differs(tmp_path: Path) -> None:
    counts = {"train": 2, "val": 1, "test": 1}
    make_shapes(tmp_path / "a", counts, seed=3, image_size=64)
    make_shapes(tmp_path / "b", counts, seed=3, image_size=64)
    make_shapes(tmp_path / "c", counts, seed=4, image_size=64)
    a, b, c = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert "images/train/train_00000.png" in a and "dataset_shapes.json" in a
    assert a == b  # every image byte for byte, every JSON
    assert a.keys() == c.keys()
    assert a["images/train/train_00000.png"] != c["images/train/train_00000.png"]
    assert a["objects.json"] != c["objects.json"]


def test_train_object_weights_change_the_training_images_only(tmp_path: Path) -> None:
    counts = {"train": 12, "val": 3, "test": 3}
    make_shapes(tmp_path / "even", counts, seed=3, image_size=64)
    make_shapes(tmp_path / "three", counts, seed=3, image_size=64, train_object_weights=(0, 0, 1))
    even, three = _files(tmp_path / "even"), _files(tmp_path / "three")
    for split in ("val", "test"):  # scored on the same images, byte for byte
        names = [name for name in even if name.startswith(f"images/{split}/")]
        assert len(names) == 3 and all(even[name] == three[name] for name in names)
        assert even[f"captions_{split}.json"] == three[f"captions_{split}.json"]
    objects = json.loads(three["objects.json"])["images"]
    karpathy = json.loads(three["dataset_shapes.json"])["images"]
    counts_by_split = {split: Counter(len(objects[str(e["cocoid"])]["objects"]) for e in karpathy
                                      if e["split"] == split) for split in ("train", "test")}
    assert counts_by_split["train"] == {3: 12}  # every training image has three objects
    even_objects = json.loads(even["objects.json"])["images"]
    assert all(objects[key] == even_objects[key] for key in objects if int(key) >= 12)
    assert len(counts_by_split["test"]) > 1  # ... and the test images keep the even draw
    for bad in ((1, -1, 1), (0, 0, 0), (1, float("nan"), 1), (1, 2)):
        with pytest.raises(ValueError, match="train_object_weights"):
            make_shapes(tmp_path / "bad", counts, seed=3, image_size=64, train_object_weights=bad)
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_generate_image_is_a_function_of_seed_split_index() -> None:
    image, objects, captions = generate_image(11, "val", 3, 64)
    again, objects_again, captions_again = generate_image(11, "val", 3, 64)
    assert np.array_equal(np.asarray(image), np.asarray(again))
    assert objects == objects_again and captions == captions_again
    other, _, _ = generate_image(11, "test", 3, 64)
    assert not np.array_equal(np.asarray(image), np.asarray(other))


def _disjoint(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[2] < b[0] or b[2] < a[0] or a[3] < b[1] or b[3] < a[1]


def test_scenes_have_one_to_three_non_overlapping_objects(generated) -> None:
    counts = Counter()
    for image, objects, _ in generated:
        assert image.size == (96, 96) and image.mode == "RGB"
        assert 1 <= len(objects) <= 3
        counts[len(objects)] += 1
        for i, obj in enumerate(objects):
            x0, y0, x1, y1 = obj.box
            assert 0 <= x0 < x1 <= 96 and 0 <= y0 < y1 <= 96
            for other in objects[i + 1:]:
                assert _disjoint(obj.box, other.box), (obj, other)
    assert set(counts) == {1, 2, 3}


def test_all_kinds_colours_and_sizes_appear(generated) -> None:
    objects = [o for _, scene, _ in generated for o in scene]
    assert len({o.shape for o in objects}) >= 4 and {o.shape for o in objects} <= set(SHAPES)
    assert {o.colour for o in objects} == set(COLOURS)
    assert {o.size for o in objects} == set(SIZES)


def test_five_captions_each(generated) -> None:
    for _, _, captions in generated:
        assert len(captions) == 5
        assert all(len(caption) >= 3 for caption in captions)


def _stated_relations(caption: list[tuple[str, int | None]]) -> list[tuple[int, str, int]]:
    """(object before, relation, object after) for each relation phrase in a linked caption."""
    words = [w for w, _ in caption]
    found = []
    for rel in RELATIONS:
        size = len(rel.split())
        for start in range(len(words) - size + 1):
            if words[start:start + size] == rel.split():
                before = [o for _, o in caption[:start] if o is not None]
                after = [o for _, o in caption[start + size:] if o is not None]
                found.append((before[-1], rel, after[0]))
    return found


def test_relation_captions_are_true(generated) -> None:
    with_relations = 0
    for _, objects, captions in generated:
        stated = [s for caption in captions for s in _stated_relations(caption)]
        if len(objects) >= 2:
            assert stated, captions
            with_relations += 1
        else:
            assert not stated
        for a, rel, b in stated:
            assert a != b
            assert relation(objects[a], objects[b]) == rel, (objects, rel)
    assert with_relations > 50


def test_relation_of_constructed_objects() -> None:
    left = ShapeObject("circle", "red", "small", (0, 40, 10, 50))
    right = ShapeObject("square", "blue", "small", (80, 45, 90, 55))
    top = ShapeObject("diamond", "green", "small", (40, 0, 50, 10))
    bottom = ShapeObject("triangle", "yellow", "small", (42, 85, 52, 95))
    assert relation(left, right) == "to the left of" and relation(right, left) == "to the right of"
    assert relation(top, bottom) == "above" and relation(bottom, top) == "below"


def test_links_point_at_words_naming_that_object(generated) -> None:
    for _, objects, captions in generated:
        for caption in captions:
            for word, target in caption:
                if word in COLOURS or word in SHAPES:
                    assert target is not None, caption  # every object word is linked
                if target is None:
                    continue
                obj = objects[target]
                if word in COLOURS:
                    assert word == obj.colour
                elif word in SHAPES:
                    assert word == obj.shape
                else:
                    assert word in SIZES and word == obj.size


def test_coco_and_karpathy_files_agree(dataset: Path) -> None:
    karpathy = json.loads((dataset / "dataset_shapes.json").read_text())["images"]
    objects = json.loads((dataset / "objects.json").read_text())
    assert len(karpathy) == sum(COUNTS.values())
    for split, count in COUNTS.items():
        coco = json.loads((dataset / f"captions_{split}.json").read_text())
        entries = [e for e in karpathy if e["split"] == split]
        ids = [image["id"] for image in coco["images"]]
        assert ids == [e["cocoid"] for e in entries] and len(ids) == count
        by_image = Counter(a["image_id"] for a in coco["annotations"])
        assert by_image == {i: 5 for i in ids}
        for image, entry in zip(coco["images"], entries):
            assert image["file_name"] == entry["filename"]
            assert (dataset / entry["filepath"] / entry["filename"]).is_file()
            coco_captions = [a["caption"] for a in coco["annotations"] if a["image_id"] == image["id"]]
            assert coco_captions == [s["raw"] for s in entry["sentences"]]
            assert all(s["tokens"] == tokenize(s["raw"]) for s in entry["sentences"])
    sentence_ids = [s["sentid"] for e in karpathy for s in e["sentences"]]
    assert len(set(sentence_ids)) == len(sentence_ids)
    assert set(objects["images"]) == {str(e["cocoid"]) for e in karpathy}


def test_objects_json_links_index_caption_tokens(dataset: Path) -> None:
    karpathy = json.loads((dataset / "dataset_shapes.json").read_text())["images"]
    objects = json.loads((dataset / "objects.json").read_text())["images"]
    for entry in karpathy:
        record = objects[str(entry["cocoid"])]
        assert len(record["links"]) == 5
        for sentence, links in zip(entry["sentences"], record["links"]):
            assert links
            for word_index, object_index in links:
                obj = record["objects"][object_index]
                assert sentence["tokens"][word_index] in (obj["colour"], obj["shape"], obj["size"])


def test_image_size_is_respected(dataset: Path) -> None:
    for path in (dataset / "images").rglob("*.png"):
        with Image.open(path) as image:
            assert image.size == (64, 64)
    coco = json.loads((dataset / "captions_train.json").read_text())
    assert all(image["width"] == 64 and image["height"] == 64 for image in coco["images"])
    objects = json.loads((dataset / "objects.json").read_text())
    assert objects["image_size"] == 64
    for record in objects["images"].values():
        for obj in record["objects"]:
            assert all(0 <= v <= 64 for v in obj["box"])
