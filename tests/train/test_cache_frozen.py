"""encoder.cache_frozen: a fine-tuned encoder's frozen stages cached, the stages that train run on the cache.

The reference throughout is the encoder run whole on the images, as inference runs it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.checkpoint import load_trained
from captioning.config import ConfigError
from captioning.data.encoded_images import EncodedCells, EncodedImages
from captioning.data.splits import features_dir, load_splits
from captioning.model.encoder import build_encoder
from captioning.train.loop import fit


@pytest.fixture(scope="module")
def lite0():
    """The embedded encoder cut at stride 16, its last block (block4) fine-tuned."""
    return build_encoder(name="efficientnet_lite0", layer="stride16", fine_tune_from="block4")


@pytest.mark.parametrize("training", [False, True])
def test_the_stages_that_train_give_from_the_cache_what_the_whole_encoder_gives_from_the_images(
        lite0, training: bool) -> None:
    images = torch.randn(3, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    frozen = lite0.frozen_stages()
    assert [name for name, _ in frozen.body.named_children()][-1] == "block3"
    with torch.no_grad():
        cells, cell_grid = frozen(images)  # [3, 36, 80]: block3's output
        whole, grid = lite0.train(training)(images)
    assert cells.shape == (3, 36, frozen.dim) and cell_grid == (6, 6)
    reading = build_encoder(name="efficientnet_lite0", layer="stride16", fine_tune_from="block4")
    reading.reading_cache(grid=cell_grid, dim=frozen.dim).train(training)
    with torch.no_grad():
        via_cache, via_grid = reading(cells)
    assert via_grid == grid
    torch.testing.assert_close(via_cache, whole, rtol=1e-4, atol=1e-4)
    lite0.eval()


def test_only_the_stages_that_train_get_gradients(lite0) -> None:
    frozen = lite0.frozen_stages()
    cells, cell_grid = frozen(torch.randn(2, 3, 96, 96))
    reading = build_encoder(name="efficientnet_lite0", layer="stride16", fine_tune_from="block4")
    reading.reading_cache(grid=cell_grid, dim=frozen.dim).train()
    reading(cells.detach())[0].square().mean().backward()
    graded = {name.split(".")[1] for name, p in reading.named_parameters() if p.grad is not None}
    assert graded == {"block4"}


def test_a_frozen_encoder_has_no_frozen_stages_to_cache(lite0) -> None:
    with pytest.raises(ValueError, match="no stage fine-tunes"):
        build_encoder(name="efficientnet_lite0", layer="stride16").frozen_stages()
    with pytest.raises(ValueError, match="every stage fine-tunes"):
        build_encoder(name="efficientnet_lite0", layer="stride16", fine_tune_from="conv_stem").frozen_stages()


@pytest.mark.parametrize(("overrides", "message"), [
    (["encoder.cache_frozen=true"], "encoder.cache_frozen caches the stages before encoder.fine_tune_from, which is "
                                    "not set"),
    (["encoder.cache_frozen=true", "encoder.fine_tune_from=conv_stem"], "trains every stage, so none is left"),
    (["encoder.cache_frozen=true", "encoder.fine_tune_from=block4", "data.feature_cache=false"],
     "encoder.cache_frozen needs data.feature_cache=true"),
    (["encoder.cache_frozen=true", "encoder.fine_tune_from=block4", "data.augment=true"],
     "data.augment changes the pixels every epoch"),
])
def test_a_cache_of_frozen_stages_that_cannot_be_is_refused(tmp_path: Path, tiny_config, overrides, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        tiny_config(tmp_path, *overrides)


def test_a_run_on_the_frozen_stages_cache_trains_the_model_that_inference_runs_on_the_images(
        tmp_path: Path, tiny_config) -> None:
    """A few steps: the cache is block3's output, block4 trains and is saved with the frozen stages'
    ImageNet weights; the checkpoint, run whole on the images, gives the annotations that training's
    validation read from the cache (up to the cache's fp16)."""
    config = tiny_config(tmp_path / "run", "encoder.fine_tune_from=block4", "encoder.cache_frozen=true",
                         "train.max_steps=3", "train.val_images=4")
    summary = fit(config)
    assert summary["steps"] == 3
    assert features_dir(config).name.startswith("efficientnet_lite0-block3-96-")
    cached = np.load(features_dir(config) / "train.npy", mmap_mode="r")
    assert cached.shape[1:] == (36, 80)  # block3: 6x6 cells of 80 channels, not block4's 112

    trained = load_trained(tmp_path / "run" / "last.pt")
    pretrained = build_encoder(name="efficientnet_lite0", layer="stride16").state_dict()
    weights = trained.encoder_weights
    moved = {key.split(".")[1] for key in pretrained if not torch.equal(weights[key], pretrained[key])}
    assert moved == {"block4"}  # what trained, and nothing the cache stands for

    encoder = trained.encoder()
    val = load_splits(config, ("val",))["val"]  # the frozen stages' cache of the val images
    from_images = EncodedImages(encoder, val.records, image_size=96)[0:8]
    # read as validation reads it mid-run: the encoder in training mode, which reading leaves as it was
    reading = encoder.reading_cache(grid=val.grid, dim=val.annotations.shape[2]).train()
    from_cache = EncodedCells(reading, val.annotations)
    assert from_cache.part(2, 8)[0:6].shape == (6, 36, 112)
    np.testing.assert_allclose(from_cache[0:8], from_images, atol=0.03, rtol=0.01)
    np.testing.assert_allclose(from_cache.part(2, 8)[0:6], from_images[2:8], atol=0.03, rtol=0.01)
    assert reading.training


def test_a_frozen_stages_cache_the_disk_cannot_hold_is_refused_at_that_stages_size(
        tmp_path: Path, tiny_config, monkeypatch) -> None:
    """The free-space check before any image is read sizes the cache that will be written: block3's
    6x6x80 per image when block4 trains on it, not the whole encoder's 6x6x112."""
    import shutil

    from captioning.data import features
    from captioning.data.records import DatasetError

    config = tiny_config(tmp_path / "run", "encoder.fine_tune_from=block4", "encoder.cache_frozen=true",
                         f"data.cache_root={tmp_path / 'cache'}")  # not the caches other tests of the data wrote
    free = shutil._ntuple_diskusage(10**12, 10**12 - 1000, 1000)  # 1 kB: no cache fits
    monkeypatch.setattr(features.shutil, "disk_usage", lambda path: free)
    with pytest.raises(DatasetError, match=r"the train feature cache needs .* \(24 images x 36 cells x 80 channels"):
        load_splits(config, ("train",))
    assert not (features_dir(config) / "train.npy").exists()
