"""How far the Java-free fallback moves the caption metrics from the standard ones: BLEU-1..4,
ROUGE-L and CIDEr on the project's own tokenization against the same metrics on pycocoevalcap's PTB
tokenizer (Java), for the same captions.

    python benchmarks/tokenizer_gap.py

Each image's first reference is its candidate and the others its references (leave-one-out: captions
as people or the generator write them, scored as a model's would be). Two sets: the shapes test split
(generated here, 200 images), the fake-COCO captions of the tests (typed as people type: curly
quotes, capitals, punctuation, stray spaces), and a few captions written to find where the two
tokenizers part (contractions, hyphens, numbers, quotes, symbols). Prints each metric under both tokenizations and the
largest difference; tests/eval/test_metrics.py holds the bound.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def gap(references: dict[int, list[str]]) -> dict[str, tuple[float, float]]:
    """metric -> (PTB tokenizer with Java, the project's tokenizer) on leave-one-out candidates."""
    from unittest import mock

    import captioning.eval.metrics as metrics

    candidates = {i: refs[0] for i, refs in references.items()}
    rest = {i: refs[1:] for i, refs in references.items()}
    standard = metrics.caption_metrics(rest, candidates, full=True)
    with mock.patch.object(metrics, "java_available", lambda: False), mock.patch("sys.stderr"):
        fallback = metrics.caption_metrics(rest, candidates, full=True)
    return {name: (standard[name], fallback[name]) for name in fallback}


def shapes_references(images: int = 200) -> dict[int, list[str]]:
    from captioning.data.formats.karpathy import read_split
    from captioning.data.shapes.scenes import make_shapes

    with tempfile.TemporaryDirectory() as folder:
        make_shapes(folder, {"train": 1, "val": 1, "test": images}, image_size=32)
        return {r.image_id: list(r.captions) for r in read_split(Path(folder) / "dataset_shapes.json", "test")}


def fake_coco_references() -> dict[int, list[str]]:
    sys.path.insert(0, str(REPO))
    from tests.data.test_coco import _captions

    return {i: _captions(split, i) for i, split in enumerate(["train"] * 5 + ["val"])}


# Where the two tokenizers can part: contractions, hyphens, numbers, quotes, symbols.
HARD_CASES = {
    1: ["A man in a t-shirt can't find his e-mail.", "a man in a T-shirt cannot find the e-mail",
        "The man's t-shirt is blue; he's reading e-mail."],
    2: ["Two dogs ($5 each) are gonna run 3.5 miles!", "two dogs are going to run 3.5 miles",
        "2 dogs run for 3.5 miles, they're fast."],
    3: ["A 5'10\" woman holds a \"STOP\" sign.", "a woman holding a stop sign",
        "The woman's sign says 'stop' in red."],
    4: ["Don't park here: a no-parking sign & a cone.", "a no parking sign next to a cone",
        "A sign that reads \"don't park\", and an orange cone."],
}


def main() -> None:
    from captioning.eval.metrics import java_available

    if not java_available():
        sys.exit("java not found: the standard tokenizer needs it")
    for name, references in (("shapes (200 test images)", shapes_references()),
                             ("fake COCO (6 images)", fake_coco_references()),
                             ("hard cases (4 images)", HARD_CASES)):
        rows = gap(references)
        print(f"{name}: " + ", ".join(f"{metric} {ptb:.4f} / {own:.4f}" for metric, (ptb, own) in rows.items())
              + f"; largest difference {max(abs(ptb - own) for ptb, own in rows.values()):.4f}")


if __name__ == "__main__":
    main()
