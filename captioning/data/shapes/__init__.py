"""The synthetic "shapes" dataset of the embedded default: its scenes, captions and object boxes
(scenes.py). What the boxes let evaluation score is captioning.eval.shapes."""
