"""What the shapes data's known object boxes let evaluation score (the data itself is
captioning.data.shapes): attention correctness and the relations the captions state
(scorer.py), and the relation probe (probe.py)."""
