"""torchvision backbones from local random-weights files (never a download): VGG-19 conv5_4, true
grids at larger inputs, fine-tuning from a stage with the frozen rest in eval mode."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest
import torch
import torchvision

from captioning.model.encoder import EncoderWeightsError, build_encoder

pytestmark = pytest.mark.usefixtures("no_network")


@pytest.fixture(scope="module")
def vgg19(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    model = torchvision.models.vgg19(weights=None).eval()
    path = tmp_path_factory.mktemp("weights") / "vgg19.pth"
    torch.save(model.state_dict(), path)
    yield path, model
    path.unlink()  # 550 MB




def test_vgg19_stride16_is_conv5_4_after_relu_before_the_last_pool(vgg19) -> None:
    path, model = vgg19
    encoder = build_encoder(name="vgg19", layer="stride16", weights_path=str(path))
    names = [name for name, _ in encoder.body.named_children()]
    assert names[-2:] == ["conv5_4", "relu5_4"] and names.count("conv5_4") == 1 and "pool5" not in names
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        annotations, grid = encoder(images)
        reference = model.features[:36](images)  # torchvision's layers 0..35: up to the ReLU of conv5_4
    assert grid == (14, 14) and annotations.shape == (1, 196, 512) and encoder.dim == 512  # the paper's 14x14x512
    torch.testing.assert_close(annotations, reference.flatten(2).transpose(1, 2))
    assert (annotations >= 0).all()  # after the ReLU


def test_vgg19_offline_without_weights_says_how_to_get_them(monkeypatch, tmp_path: Path) -> None:
    import torch.hub

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    calls = []

    def offline(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("no network (test)")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(EncoderWeightsError) as info:
        build_encoder(name="vgg19", layer="stride16")
    assert calls and calls[0] in str(info.value) and "encoder.weights_path" in str(info.value)


@pytest.mark.parametrize("size, layer, grid", [(224, "stride32", (7, 7)), (448, "stride32", (14, 14)),
                                               (224, "stride16", (14, 14))])
def test_resnet_grid_is_the_true_grid_of_the_input_size(resnet18_file: Path, size: int, layer: str, grid) -> None:
    encoder = build_encoder(name="resnet18", layer=layer, weights_path=str(resnet18_file))
    with torch.no_grad():
        annotations, got = encoder(torch.zeros(1, 3, size, size))
    assert got == grid and annotations.shape == (1, grid[0] * grid[1], encoder.dim)
    assert encoder.dim == (512 if layer == "stride32" else 256)


def test_fine_tune_from_trains_that_stage_on_and_keeps_the_rest_frozen_in_eval(resnet18_file: Path) -> None:
    encoder = build_encoder(name="resnet18", layer="stride32", weights_path=str(resnet18_file),
                            fine_tune_from="layer4")
    assert encoder.trainable == ["layer4"] and not encoder.training  # built in eval mode
    trainable = {name.split(".")[1] for name, p in encoder.named_parameters() if p.requires_grad}
    assert trainable == {"layer4"}
    encoder.train()
    assert encoder.body.layer4.training and all(m.training for m in encoder.body.layer4.modules())
    assert not any(m.training for name, m in encoder.body.named_children() if name != "layer4")
    assert not encoder.body.bn1.training and not encoder.body.layer3[0].bn1.training
    frozen = build_encoder(name="resnet18", layer="stride32", weights_path=str(resnet18_file))
    frozen.train()  # a frozen encoder stays in eval mode whatever the caller does
    assert not any(m.training for m in frozen.modules())
    assert not any(p.requires_grad for p in frozen.parameters())
