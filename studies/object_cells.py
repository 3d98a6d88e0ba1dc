"""Which cells of a grid lie on an object of a shapes image: what the studies that ask where
objects sit in the annotations compare with (studies/position_in_features, studies/attention_table).
"""

from __future__ import annotations

import numpy as np

from captioning.data.shapes.scenes import SceneObjects


def object_cells(scene: SceneObjects, rows: int, columns: int) -> np.ndarray:
    """[rows * columns] bool, in grid order: the cells whose centre lies inside an object's box."""
    y, x = np.meshgrid((np.arange(rows) + 0.5) * scene.height / rows,
                       (np.arange(columns) + 0.5) * scene.width / columns, indexing="ij")
    hit = np.zeros((rows, columns), dtype=bool)
    for o in scene.objects:
        hit |= (x >= o.box[0]) & (x <= o.box[2]) & (y >= o.box[1]) & (y <= o.box[3])
    return hit.reshape(-1)
