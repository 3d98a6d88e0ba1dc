"""COCO's instances files read for a split: only its images kept, the files read until every image is
found, masks decoded as pycocotools' COCO.annToMask does, and absent files said once in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from captioning.data.instances import ImageObjects, Instances, instance_mask, read_instances
from captioning.data.records import DatasetError

SQUARE = [1, 1, 3, 1, 3, 3, 1, 3]  # a polygon with corners (1, 1) and (3, 3): rows and columns 1-2


def _write(path: Path, images: dict[int, list[tuple[int, object]]]) -> Path:
    """An instances file of 6 x 4 images: {image id: [(category id, segmentation), ...]}."""
    annotations = [{"id": n, "image_id": image_id, "category_id": category, "segmentation": segmentation,
                    "iscrowd": int(isinstance(segmentation, dict)), "area": 0.0, "bbox": [0, 0, 0, 0]}
                   for n, (image_id, category, segmentation) in enumerate(
                       ((i, c, s) for i, objects in images.items() for c, s in objects), start=1)]
    path.write_text(json.dumps({
        "images": [{"id": i, "width": 6, "height": 4, "file_name": f"{i}.jpg"} for i in images],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}, {"id": 88, "name": "teddy bear"}]}))
    return path


def test_only_the_split_s_images_are_kept_and_reading_stops_once_all_are_found(tmp_path: Path) -> None:
    val = _write(tmp_path / "val.json", {1: [(18, [SQUARE]), (1, [SQUARE])], 2: [], 3: [(88, [SQUARE])]})
    broken = tmp_path / "train.json"
    broken.write_text("{not json")  # never opened: the split's images are all in the first file
    found = read_instances([val, broken], [3, 1, 2])
    assert set(found) == {1, 2, 3}
    assert found[1].categories == {"dog", "person"} and found[2].objects == () and found[3].categories == {"teddy bear"}
    assert (found[1].width, found[1].height) == (6, 4)
    with pytest.raises(DatasetError) as error:  # an image of the second file: it is read, and it is broken
        read_instances([val, broken], [1, 7])
    assert str(broken) in str(error.value) and "\n" not in str(error.value)
    assert set(read_instances([tmp_path / "absent.json", val], [1, 7])) == {1}  # 7 is in no file


def test_a_mask_is_decoded_from_polygons_or_run_length_encoding() -> None:
    expected = np.zeros((4, 6), dtype=bool)
    expected[1:3, 1:3] = True
    assert np.array_equal(instance_mask([SQUARE], width=6, height=4), expected)
    # a crowd's uncompressed RLE: column-major runs of 0s and 1s (4 off, 2 on, 2 off, 2 on, 14 off)
    crowd = instance_mask({"counts": [4, 2, 2, 2, 14], "size": [4, 6]}, width=6, height=4)
    column_major = np.zeros(24, dtype=bool)
    column_major[4:6] = column_major[8:10] = True
    assert np.array_equal(crowd, column_major.reshape(6, 4).T)
    two = ImageObjects(6, 4, (("dog", [SQUARE]), ("dog", [[4, 0, 6, 0, 6, 2, 4, 2]]), ("person", [SQUARE])))
    assert two.mask("dog").sum() == 4 + 4 and two.mask("cat").sum() == 0  # the union of the dog's two


def test_absent_files_are_said_once_in_one_line_and_give_nothing(tmp_path: Path, capsys) -> None:
    instances = Instances([tmp_path / "val.json", tmp_path / "train.json"], [1, 2])
    assert instances.objects() is None and instances.objects() is None
    err = capsys.readouterr().err
    assert err == (f"note: no COCO instances file ({tmp_path / 'val.json'}, {tmp_path / 'train.json'}): "
                   "evaluating without CHAIR and attention correctness\n")


def test_images_in_no_file_are_none_and_counted_once(tmp_path: Path, capsys) -> None:
    val = _write(tmp_path / "val.json", {1: [(18, [SQUARE])]})
    instances = Instances([val, tmp_path / "train.json"], [1, 5])
    objects = instances.objects()
    assert objects[0].categories == {"dog"} and objects[1] is None and instances.objects() is objects
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("note: 1 of 2 images are in no instances file")
