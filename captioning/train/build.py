"""What a run trains, built from its config and data: the encoder (where it runs on the fly), the
decoder and its weights' average, the optimizer and the learning-rate schedule (captioning.train.loop
builds a run from these, then restores or warm-starts them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from captioning.config import Config
from captioning.data.run_data import RunData
from captioning.data.splits import reads_frozen_stages, uses_feature_cache
from captioning.model.encoder import Encoder
from captioning.model.encoder_decoder import build_decoder
from captioning.model.paper import AttentionDecoder
from captioning.runtime import distributed
from captioning.train.extras.averaging import WeightAverage
from captioning.train.objective import TrainingError


@dataclass
class RunModel:
    """What a run holds of its model: the decoder and (where it runs on the fly) the encoder that it
    trains (as one EncoderDecoder: captioning.train.loop), the weights' average that it validates and
    keeps, and the grid and width of the annotations."""

    decoder: AttentionDecoder
    encoder: Encoder | None  # runs on the fly: fine-tuned, or the cache is off
    average: WeightAverage | None  # train.ema_decay (train/extras/averaging.py)
    grid: tuple[int, int]  # (Hg, Wg) of the annotations
    annotation_dim: int

    @property
    def validated(self) -> nn.Module:
        """The decoder that is validated and saved as "decoder": the weights' average where there is one."""
        return self.decoder if self.average is None else self.average.module


def build_encoder(config: Config, device: torch.device, context: distributed.Distributed) -> Encoder | None:
    """The encoder, where it runs on the fly (with encoder.cache_frozen, its stages that train, on
    their cached input); None where training reads cached annotations. Under DDP on GPUs its
    fine-tuned batch-norm stages see the global batch's statistics (SyncBatchNorm)."""
    if uses_feature_cache(config) and not reads_frozen_stages(config):
        return None
    return distributed.sync_batch_norm(Encoder.from_config(config.encoder).to(device), context, device=device)


# How torch's allocators say that an allocation failed (CPU: "not enough memory" or "can't allocate
# memory", by version; CUDA: "out of memory").
_NO_MEMORY = ("not enough memory", "can't allocate memory", "cannot allocate memory", "out of memory")


def build_model(config: Config, data: RunData, encoder: Encoder | None, device: torch.device) -> RunModel:
    """The decoder for the data's annotations (their grid and width), and the weights' average."""
    t = config.train
    if encoder is not None:  # the grid the encoder gives at this input size (or from its cached input)
        with torch.no_grad():
            side = config.data.image_size
            blank = (torch.zeros(1, *data.train.annotations.shape[1:], device=device) if encoder.cached_grid
                     else torch.zeros(1, 3, side, side, device=device))
            grid = encoder.eval()(blank)[1]
        data.val.grid = data.train.grid = grid
        annotation_dim = encoder.dim
    else:
        grid, annotation_dim = data.train.grid, data.train.annotations.shape[2]
    torch.manual_seed(t.seed)  # the initial weights follow train.seed, whatever the data work drew
    try:
        decoder = build_decoder(config.model, vocab_size=len(data.vocab), annotation_dim=annotation_dim,
                                grid=grid).to(device)
    except (MemoryError, RuntimeError) as error:  # sizes within the config's bounds, too large for this machine
        if not isinstance(error, MemoryError) and not any(words in str(error).lower() for words in _NO_MEMORY):
            raise
        m = config.model
        raise TrainingError(f"model.embed_dim={m.embed_dim}, model.hidden_dim={m.hidden_dim}, model.attention_dim="
                            f"{m.attention_dim}: the decoder is too large to build on {device} (not enough memory "
                            f"for its weights, with {len(data.vocab)} words and {annotation_dim}-wide annotations); "
                            "make them smaller") from error
    average = WeightAverage(decoder, decay=t.ema_decay) if t.ema_decay else None
    return RunModel(decoder, encoder, average, grid, annotation_dim)


def build_optimizer(config: Config, model: RunModel) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer (the encoder's trained stages at their own rate) and the plateau schedule."""
    t = config.train
    groups = [{"params": list(model.decoder.parameters()), "lr": t.lr}]
    if model.encoder is not None and model.encoder.trainable:
        groups.append({"params": [p for p in model.encoder.parameters() if p.requires_grad], "lr": config.encoder.lr})
    # Adam's fused kernel updates every parameter in one pass (CPU and CUDA; docs/benchmarks.md).
    optimizer = torch.optim.Adam(groups, fused=True) if t.optimizer == "adam" else torch.optim.RMSprop(groups)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=t.lr_decay,
                                                           patience=t.lr_patience)
    return optimizer, scheduler
