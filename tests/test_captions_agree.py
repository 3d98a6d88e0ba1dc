"""The three ways to caption a checkpoint's images agree: the `caption` command, the Python API
(captioning.Captioner) and eval.py, on the same checkpoint and the same images.

Each path prepares images on its own: eval.py reads the split's feature cache (written by the data
pipeline), `caption` reads the files in DataLoader batches (Captioner.caption_files), the API reads
each image itself (Captioner.caption). The images here are 136 pixels for a model trained at 96, so
every path must resize as well as normalize; a difference in any of it changes captions or scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from captioning import Captioner
from captioning.cli import eval_main, main

SIDE = 136  # not the tiny model's 96: every path resizes


@pytest.fixture(scope="module")
def other_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second shapes dataset (other scenes, another size) whose test split eval.py caches itself."""
    from captioning.data.shapes.scenes import make_shapes

    root = tmp_path_factory.mktemp("shapes136")
    make_shapes(root, {"train": 1, "val": 1, "test": 12}, seed=3, image_size=SIDE)
    return root


def test_caption_command_api_and_eval_give_the_same_captions(tiny_run, other_images: Path, tmp_path: Path,
                                                             capsys) -> None:
    coco = json.loads((other_images / "captions_test.json").read_text())
    folder = other_images / "images" / "test"
    paths = {image["id"]: str(folder / image["file_name"]) for image in coco["images"]}

    results = tmp_path / "captions.json"
    assert eval_main(["--checkpoint", str(tiny_run.checkpoint), "--split", "test", "--results", str(results),
                      f"data.root={other_images}"]) == 0
    evaluated = {paths[r["image_id"]]: r["caption"] for r in json.loads(results.read_text())}
    capsys.readouterr()

    assert main(["caption", *paths.values(), "--checkpoint", str(tiny_run.checkpoint), "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    commanded = {record["image"]: record["caption"] for record in printed}

    captioner = Captioner.from_checkpoint(tiny_run.checkpoint, device="cpu")
    one_by_one = captioner.caption(list(paths.values()))
    api = {result.source: result.caption for result in one_by_one}

    assert len(evaluated) == len(paths) == 12
    assert len(set(evaluated.values())) >= 2, evaluated  # the images get different captions: a mix-up shows
    assert commanded == evaluated
    assert api == evaluated
    # Captions are coarse; the command's way of reading files must also give the API's numbers.
    files = list(captioner.caption_files(list(paths.values()), batch_size=5))
    np.testing.assert_allclose([r.score for r in files], [r.score for r in one_by_one], rtol=0, atol=1e-4)
    for read, alone in zip(files, one_by_one):
        np.testing.assert_allclose(read.alphas, alone.alphas, rtol=0, atol=1e-4)
