"""Show, Attend and Tell: soft and hard visual attention for image captioning (Xu et al., 2015).

The paper's model is captioning.model (encoder, scores, attention, decoder); training is
captioning.train, evaluation captioning.eval, data captioning.data. A run is described by a config
(captioning.config.load_config). A trained model captions images through captioning.api.Captioner:

    from captioning import Captioner
    result = Captioner.from_checkpoint("runs/shapes_soft/best.pt").caption("photo.jpg")
"""

from typing import TYPE_CHECKING, Any

from captioning.config import load_config

if TYPE_CHECKING:
    from captioning.api import Captioned, Captioner, Unreadable

__all__ = ["Captioned", "Captioner", "Unreadable", "load_config"]


def __getattr__(name: str) -> Any:
    """The API on first use: `import captioning` alone (e.g. for the config) does not load torch."""
    if name in ("Captioned", "Captioner", "Unreadable"):
        from captioning import api

        return getattr(api, name)
    raise AttributeError(f"module 'captioning' has no attribute {name!r}")
