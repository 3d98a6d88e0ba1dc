"""Options that are not in the paper, one module each, every one off by default.

Each plugs into one seam of the paper's model and nowhere else: the image summary the initial
state is computed from (layout.py), the attention query (query_word.py), the annotations attention
sees (position.py, unit_annotations.py), the attention module itself (glimpses.py) and the local
score's window (window.py). captioning/model/encoder_decoder.py reads `model.extras` (and `model.local`)
and hands them in; paper.py and scores.py never ask whether one is present.
"""
