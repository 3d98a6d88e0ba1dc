"""What COCO's instances annotations let evaluation score (the annotations themselves are
captioning.data.instances): object hallucination (CHAIR) and attention correctness on the instance
masks (scorer.py), through the synonym list of CHAIR (synonyms.py)."""
