"""Training options that are not in the paper, one module each, both off by default: a moving
average of the decoder's weights (averaging.py) and per-word weights in the cross-entropy
(word_weights.py). The run (train/loop.py, train/paper_objective.py) takes them; the loss and the step stay the
paper's."""
