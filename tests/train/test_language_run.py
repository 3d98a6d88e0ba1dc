"""A run on captions in German from end to end, in miniature: a Flickr-style split file, its German
token file, a few steps, then eval.py. The vocabulary keeps the German words whole, and the record,
the metrics file and the output name the language."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from captioning.checkpoint import load_checkpoint
from captioning.cli import eval_main, train_main
from tests.tiny import REPO

COLOURS = {"rot": (200, 30, 30), "grün": (30, 180, 60), "weiß": (240, 240, 240)}


def _german_flickr(root: Path) -> Path:
    """12 photos of one colour each (8 train, 4 val) and one without a German caption."""
    entries, lines = [], []
    for i in range(13):
        colour = list(COLOURS)[i % 3]
        name = f"{1000 + i}_photo.jpg"
        Image.new("RGB", (64, 64), COLOURS[colour]).save(root / name)
        entries.append({"filename": name, "imgid": i, "split": "train" if i < 8 or i == 12 else "val",
                        "sentences": [{"raw": f"A {i} photo."}]})
        if i < 12:  # the last photo has no German caption
            lines += [f"{name}#0\tEin Quadrat, {colour}, über der Straße.", f"{name}#1\tGRÖẞE UND FARBE: {colour}!"]
    (root / "dataset_flickr8k.json").write_text(json.dumps({"images": entries}))
    (root / "de.token.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_a_german_run_trains_and_is_scored_as_german(tmp_path: Path, resnet18_file: Path, capsys) -> None:
    root = _german_flickr(tmp_path)
    out = tmp_path / "run"
    common = [f"data.root={root}", "data.image_dir=.", "encoder.name=resnet18", f"encoder.weights_path={resnet18_file}",
              "data.image_size=64", "data.token_file=de.token.txt", "data.language=de"]
    assert train_main(["--config", str(REPO / "configs" / "flickr8k_soft.yaml"), *common, f"train.out_dir={out}",
                       "train.max_steps=2", "train.batch_size=4", "train.num_workers=0", "train.amp=false",
                       "train.val_images=4", "data.min_word_count=1"]) == 0
    err = capsys.readouterr().err
    assert err.count("train: 1 of 9 images have no caption there, left out") == 1

    vocab = json.loads((out / "vocab.json").read_text())
    assert {"straße", "über", "größe", "grün", "weiß", "rot"} <= set(vocab)  # whole, lowered by Unicode
    assert not {"stra", "gr", "ber"} & set(vocab)
    record = load_checkpoint(out / "best.pt")["record"]
    assert record["data"]["language"] == "de" and record["data"]["train_images"] == 8
    assert record["validation"]["tokenizer"] == "the project's Unicode words (de)"

    metrics_file = tmp_path / "metrics.json"
    assert eval_main(["--checkpoint", str(out / "best.pt"), "--split", "val", "--out", str(metrics_file),
                      "--beam-size", "1", *[o for o in common if not o.startswith("data.token")]]) == 0
    printed = capsys.readouterr()
    metrics = json.loads(metrics_file.read_text())
    assert metrics["language"] == "de" and metrics["tokenizer"] == "the project's Unicode words (de)"
    assert "METEOR" not in metrics and {"Bleu_4", "ROUGE_L", "CIDEr"} <= set(metrics)
    assert "tokenizer                      the project's Unicode words (de)" in printed.out
    assert "note: METEOR is not scored on captions in de" in printed.err
    assert "(4 images," in printed.out  # the val photos, all of which have German captions
