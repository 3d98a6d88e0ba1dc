"""Show, Attend and Tell: soft and hard visual attention for image captioning (Xu et al., 2015).

The paper's model is captioning.model (encoder, scores, attention, decoder); training is
captioning.train, evaluation captioning.eval, data captioning.data. A run is described by a config
(captioning.config.load_config). A trained model captions images through captioning.api.Captioner:

    from captioning import Captioner
    result = Captioner.from_checkpoint("runs/shapes_soft/best.pt").caption("photo.jpg")
"""

from typing import TYPE_CHECKING, Any

import captioning.config.registry as _registry
from captioning.config import load_config

# Every module that registers a score, a window, a dataset format or an objective
# (captioning.config.registry), imported the first time a registry is read: by then this file has
# run, as Python runs it before any module of the package. A new one is its module plus its name here.
_registry.fill_with((
    "captioning.data.formats.coco_official",
    "captioning.data.formats.folder",
    "captioning.data.formats.folder_report",
    "captioning.data.formats.karpathy",
    "captioning.data.formats.shapes",
    "captioning.model.paper",
    "captioning.model.scores",
    "captioning.model.extras.window",
    "captioning.train.paper_objective",
    "captioning.train.scst",
))

if TYPE_CHECKING:
    from captioning.api import Captioned, Captioner, Unreadable

__all__ = ["Captioned", "Captioner", "Unreadable", "load_config"]


def __getattr__(name: str) -> Any:
    """The API on first use (it is the top layer: importing it here would import it for everyone)."""
    if name in ("Captioned", "Captioner", "Unreadable"):
        from captioning import api

        return getattr(api, name)
    raise AttributeError(f"module 'captioning' has no attribute {name!r}")
