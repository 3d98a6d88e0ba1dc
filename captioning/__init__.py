"""Show, Attend and Tell: soft and hard visual attention for image captioning (Xu et al., 2015).

The paper's model is captioning.model (encoder, scores, attention, decoder); training is
captioning.train, evaluation captioning.eval, data captioning.data. A run is described by a config
(captioning.config.load_config).
"""

from captioning.config import load_config

__all__ = ["load_config"]
