"""The synthetic "shapes" dataset of the embedded default: its scenes, captions and object boxes
(scenes.py), and the folders it may be written into (destination.py). What the boxes let
evaluation score is captioning.eval.shapes."""

# How many images `captioning make-shapes` writes per split, and the embedded default's data holds.
SHAPES_DEFAULT_COUNTS = {"train": 4000, "val": 500, "test": 500}
