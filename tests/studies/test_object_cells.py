"""studies/object_cells.py: the cells of a grid that lie on a shapes image's objects."""

from __future__ import annotations

from captioning.data.shapes.scenes import SceneObjects, ShapeObject
from studies.object_cells import object_cells


def test_object_cells_are_the_cells_whose_centre_lies_in_a_box() -> None:
    # A 4x4 grid over 80 px: cell centres at 10, 30, 50, 70. The box holds x in [25, 55], y in [5, 35].
    truth = SceneObjects([ShapeObject("circle", "red", "small", (25.0, 5.0, 55.0, 35.0))], width=80, height=80)
    cells = object_cells(truth, 4, 4).reshape(4, 4)
    expected = [[False, True, True, False], [False, True, True, False], [False] * 4, [False] * 4]
    assert cells.tolist() == expected
    assert not object_cells(SceneObjects([], width=80, height=80), 4, 4).any()
