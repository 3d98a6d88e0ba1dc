"""Per-word weights in the cross-entropy (train.word_weights; not in the paper).

Chosen target words' cross-entropy counts several times, e.g. {to: 3, above: 3}: a word that decides
a spatial relation is one token in ten of a caption, decided before its second object is named, and
with equal weights the decoder learns it last. The loss is still divided by the number of words
(captioning.model.paper.cross_entropy), so all-ones weights give the paper's loss.
"""

from __future__ import annotations

import torch

from captioning.data.vocab import Vocabulary
from captioning.train.objective import TrainingError


def word_weight_vector(weights: dict[str, float], vocab: Vocabulary) -> torch.Tensor:
    """train.word_weights as a [V] tensor, 1 for every word it does not name."""
    unknown = sorted(word for word in weights if word not in vocab.index)
    if unknown:
        raise TrainingError(f"train.word_weights: not in the vocabulary: {', '.join(unknown)}")
    vector = torch.ones(len(vocab))
    for word, weight in weights.items():
        vector[vocab.index[word]] = float(weight)
    return vector
