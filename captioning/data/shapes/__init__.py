"""The synthetic "shapes" dataset of the embedded default: its scenes and captions (scenes.py), what
its known object boxes let us score (grounding.py), and the relation probe (probe.py)."""
