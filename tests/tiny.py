"""What the tests share besides fixtures: the repository's root and the tiny sizes of the tiny runs.

The real EfficientNet-Lite0 encoder is slow on a CPU, so the tests' shapes dataset is tiny (24 / 8 /
8 images at 96², a 6x6 grid at stride 16) and its features are computed once per session.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGE_SIZE = 96  # a 6x6 grid at stride 16
COUNTS = {"train": 24, "val": 8, "test": 8}
TINY = (
    f"data.image_size={IMAGE_SIZE}",
    "model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16",
    "train.batch_size=16",  # 24 images x 5 captions = 120 pairs: 8 batches per epoch
    "train.epochs=100", "train.early_stop_patience=100", "train.lr=0.01",
    "decode.beam_size=2", "decode.max_length=12",
)
