"""A short real training run on the shapes data must reach a quality bar.

Fixed data, seed and number of epochs, thresholds with a margin below what the run reaches (see the
numbers in the assertion messages); a change that breaks learning or attention fails here. It is
the slowest test (about two minutes on 2 cores), and it asserts quality, never time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
from captioning.config import load_config
from captioning.data.shapes import make_shapes
from captioning.data.splits import load_splits
from captioning.evaluation import evaluate_split
from captioning.training import fit
from captioning.vocab import Vocabulary

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "shapes_soft.yaml"


@pytest.mark.slow
def test_soft_attention_learns_to_caption_and_to_look_at_the_object(tmp_path):
    root, out = tmp_path / "shapes", tmp_path / "run"
    make_shapes(root, {"train": 600, "val": 60, "test": 100}, seed=7)
    config = load_config(CONFIG, [f"data.root={root}", f"train.out_dir={out}", "train.epochs=5",
                                  "train.val_images=60", "train.seed=7"])
    fit(config)

    payload = load_checkpoint(out / "best.pt")
    test = load_splits(config, ("test",))["test"]
    metrics, _ = evaluate_split(
        decoder_from_checkpoint(payload, config), test.annotations, image_ids=test.image_ids,
        references=test.references, vocab=Vocabulary(payload["vocab"]), grid=test.grid, grounding=test.grounding,
        beam_size=1, full=False)

    assert metrics["Bleu_4"] >= 0.45, metrics
    ratio = metrics["attention_correctness"] / metrics["attention_correctness_chance"]
    assert ratio >= 2.5, metrics
