"""The three ways to caption a checkpoint's images agree: the `caption` command, the Python API
(captioning.Captioner) and eval.py, on the same checkpoint and the same images.

Each path prepares images on its own: eval.py reads the split's feature cache (written by the data
pipeline), `caption` reads the files in DataLoader batches (Captioner.caption_files), the API reads
each image itself (Captioner.caption). The images here are 136 pixels for a model trained at 96, so
every path must resize as well as normalize; a difference in any of it changes captions or scores.
Both normalizations are checked: EfficientNet-Lite0's (mean = std = 0.5, where swapping mean and std
changes nothing) and ImageNet's, which ResNet and VGG use (a tiny ResNet-18 model here).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning import Captioner
from captioning.cli import eval_main, main

SIDE = 136  # not the tiny model's 96: every path resizes


@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory: pytest.TempPathFactory, tiny_config, resnet18_file: Path) -> Path:
    """A tiny model on ResNet-18 annotations (random weights from a local file; ImageNet's mean and
    std): its best.pt."""
    from captioning.train.loop import fit

    out = tmp_path_factory.mktemp("resnet_run")
    fit(tiny_config(out, "encoder.name=resnet18", f"encoder.weights_path={resnet18_file}", "encoder.layer=stride16",
                    "train.max_steps=20"))  # the numbers are compared, not the captions: a little training will do
    return out / "best.pt"


@pytest.fixture(scope="module")
def other_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second shapes dataset (other scenes, another size) whose test split eval.py caches itself."""
    from captioning.data.shapes.scenes import make_shapes

    root = tmp_path_factory.mktemp("shapes136")
    make_shapes(root, {"train": 1, "val": 1, "test": 12}, seed=3, image_size=SIDE)
    return root


@pytest.mark.parametrize("encoder", ["efficientnet_lite0", "resnet18"])
def test_caption_command_api_and_eval_give_the_same_captions(encoder: str, request, other_images: Path,
                                                             tmp_path: Path, capsys) -> None:
    checkpoint = request.getfixturevalue("tiny_run").checkpoint if encoder == "efficientnet_lite0" else \
        request.getfixturevalue("resnet_run")
    coco = json.loads((other_images / "captions_test.json").read_text())
    folder = other_images / "images" / "test"
    paths = {image["id"]: str(folder / image["file_name"]) for image in coco["images"]}

    results = tmp_path / "captions.json"
    assert eval_main(["--checkpoint", str(checkpoint), "--split", "test", "--results", str(results),
                      f"data.root={other_images}"]) == 0
    evaluated = {paths[r["image_id"]]: r["caption"] for r in json.loads(results.read_text())}
    capsys.readouterr()

    assert main(["caption", *paths.values(), "--checkpoint", str(checkpoint), "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    commanded = {record["image"]: record["caption"] for record in printed}

    captioner = Captioner.from_checkpoint(checkpoint, device="cpu")
    one_by_one = captioner.caption(list(paths.values()))
    api = {result.source: result.caption for result in one_by_one}

    assert len(evaluated) == len(paths) == 12
    if encoder == "efficientnet_lite0":  # (the ResNet's random weights give one caption for all: numbers below)
        assert len(set(evaluated.values())) >= 2, evaluated  # the images get different captions: a mix-up shows
    assert commanded == evaluated
    assert api == evaluated
    # The numbers of eval.py's path too: the same decoder on the cache the data pipeline wrote (fp16)
    # gives the API's scores and maps, so each image was normalized alike on both paths.
    from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
    from captioning.config import apply_overrides, validate
    from captioning.data.splits import load_splits
    from captioning.model.decoding import decode

    payload = load_checkpoint(checkpoint)
    config = validate(apply_overrides(captioner.config, [f"data.root={other_images}"]))
    test = load_splits(config, ("test",))["test"]
    cached = decode(decoder_from_checkpoint(payload, config), torch.from_numpy(np.array(test.annotations)).float(),
                    beam_size=config.decode.beam_size, max_length=config.decode.max_length)
    by_path = {paths[image]: row for row, image in enumerate(test.image_ids)}
    for result in one_by_one:
        row = by_path[result.source]
        assert abs(float(cached.scores[row]) - result.score) < 0.02, result.source
        words = len(result.alphas)  # [words, Hg, Wg]
        np.testing.assert_allclose(cached.alphas[row, :words].reshape(result.alphas.shape).numpy(), result.alphas,
                                   rtol=0, atol=0.01)
    # Captions are coarse; the command's way of reading files must also give the API's numbers.
    files = list(captioner.caption_files(list(paths.values()), batch_size=5))
    np.testing.assert_allclose([r.score for r in files], [r.score for r in one_by_one], rtol=0, atol=1e-4)
    for read, alone in zip(files, one_by_one):
        np.testing.assert_allclose(read.alphas, alone.alphas, rtol=0, atol=1e-4)
