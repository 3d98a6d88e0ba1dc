"""The captioning model: a pretrained encoder and the attention decoder, built from a config's sections
(EncoderDecoder: pixels in, captions out).

Notation: B batch, S input side, L grid cells, D annotation channels, Q query size.

This is the one place that reads `model:`. The paper's model (paper.py) and the other scores
(scores.py) take explicit arguments; each option that is not in the paper (`model.extras`,
`model.local.window: learned`) is a module of captioning/model/extras handed to one of the
decoder's seams here: the image summary of the initial state, the attention query, what attention
sees of the annotations, and the attention module itself.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from captioning.config import Config, ModelConfig
from captioning.config.registry import SCORES
from captioning.model.accelerator import accelerator_for
from captioning.model.decoding import Captions, decode
from captioning.model.encoder import Encoder
from captioning.model.extras.glimpses import TwoGlimpses
from captioning.model.extras.grid_attention import GridSelfAttention
from captioning.model.extras.layout import LayoutSummary
from captioning.model.extras.position import GridCoordinates, GridPosition
from captioning.model.extras.query_word import WordInQuery
from captioning.model.extras.unit_annotations import UnitAnnotations
from captioning.model.extras.word_attention import WordSelfAttention
from captioning.model.paper import (
    AttentionDecoder,
    DecoderOutput,
    Draws,
    HardAttention,
    MeanAnnotation,
    PreviousState,
    SoftAttention,
)


def build_score(model: ModelConfig, *, annotation_dim: int, query_dim: int,
                grid: tuple[int, int] | None) -> nn.Module:
    """model.score, with the settings of its own section where it has one (model.cosine, model.local)."""
    return SCORES[model.score].from_config(model, annotation_dim=annotation_dim, hidden_dim=query_dim, grid=grid)


def _inputs(model: ModelConfig, *, annotation_dim: int, grid: tuple[int, int] | None) -> tuple[nn.Module, ...]:
    """What attention sees of the annotations: as they are (the paper), or with model.extras applied."""
    extras, inputs = model.extras, []
    if extras.unit_annotations:
        inputs.append(UnitAnnotations())
    if extras.position != "none" and grid is None:
        raise ValueError(f"model.extras.position={extras.position} needs the annotation grid (Hg, Wg)")
    if extras.position == "learned":
        inputs.append(GridPosition(grid=grid, annotation_dim=annotation_dim))
    elif extras.position == "coordinates":
        inputs.append(GridCoordinates(grid=grid))
    if extras.grid_attention:  # last: the cells attend to each other as attention will see them
        inputs.append(GridSelfAttention(annotation_dim=annotation_dim + sum(m.channels for m in inputs),
                                        heads=extras.grid_attention))
    return tuple(inputs)


def build_attention(model: ModelConfig, *, annotation_dim: int, query_dim: int, grid: tuple[int, int] | None,
                    kind: str | None = None) -> nn.Module:
    """Soft or hard attention (`kind`, default model.attention) with model.score, queried by
    `query_dim`-wide queries."""
    inputs = _inputs(model, annotation_dim=annotation_dim, grid=grid)
    channels = sum(module.channels for module in inputs)  # the score sees what the inputs append
    score = build_score(model, annotation_dim=annotation_dim + channels, query_dim=query_dim, grid=grid)
    shared = {"temperature": model.extras.temperature, "inputs": inputs}
    if (kind or model.attention) == "hard":
        hard = model.hard
        return HardAttention(score, **shared, expectation_prob=hard.expectation_prob, coin=hard.coin)
    return SoftAttention(score, **shared)


def build_decoder(model: ModelConfig, *, vocab_size: int, annotation_dim: int,
                  grid: tuple[int, int] | None = None) -> AttentionDecoder:
    """The decoder of `model:`. `grid` (Hg, Wg) is needed by the location and local scores, the
    2-D position and the layout summary."""
    extras = model.extras
    query = WordInQuery() if extras.query_word else PreviousState()
    if extras.word_attention:
        query = WordSelfAttention(hidden_dim=model.hidden_dim, key_dim=model.attention_dim, base=query)
    query_dim = query.dim(hidden_dim=model.hidden_dim, embed_dim=model.embed_dim)
    attention = build_attention(model, annotation_dim=annotation_dim, query_dim=query_dim, grid=grid)
    if extras.glimpses == 2:  # queried with [q_t; z_t]
        second = build_attention(model, kind="soft", annotation_dim=annotation_dim, grid=grid,
                                 query_dim=query_dim + attention.context_dim(annotation_dim))
        attention = TwoGlimpses(attention, second)
    summary = MeanAnnotation
    if extras.init == "layout":
        if grid is None:
            raise ValueError("model.extras.init=layout needs the annotation grid (Hg, Wg)")
        summary = functools.partial(LayoutSummary, cells=grid[0] * grid[1])
    decoder = AttentionDecoder(vocab_size=vocab_size, annotation_dim=annotation_dim, embed_dim=model.embed_dim,
                               hidden_dim=model.hidden_dim, attention=attention, gate=model.gate,
                               dropout=model.dropout, deep_output=model.deep_output, summary=summary, query=query)
    decoder.accelerator = accelerator_for(decoder, enabled=model.fused)  # the fused path where it applies
    return decoder


# On a CPU the encoder runs this many images at a time (see EncoderDecoder.encode).
CPU_ENCODER_CHUNK = 4


class EncoderDecoder(nn.Module):
    """The model: the encoder, then the decoder. One module for both of its uses:

    - `caption`: images [B, 3, S, S] -> captions with a map per word, the one way from pixels to
      captions (the Python API's and the caption command's; evaluation decodes the annotations that
      the feature cache, or the encoder on the fly, gives it);
    - `forward`: teacher forcing, what a training step trains (and DistributedDataParallel wraps,
      the whole trained graph at once). Training on the feature cache has no encoder
      (`encoder=None`): its source is the annotations.
    """

    def __init__(self, *, encoder: Encoder | None, decoder: AttentionDecoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, source: torch.Tensor, inputs: torch.Tensor, *, lengths: torch.Tensor | None = None,
                repeats: int = 1, draws: Draws | None = None) -> DecoderOutput:
        """Teacher forcing. source: annotations [B, L, D], or images [B, 3, S, S] when there is an
        encoder; inputs [B*repeats, T] (each caption `repeats` times in a row: train.reinforce.location_samples);
        lengths [B*repeats] the real steps of each row and draws hard attention's randomness
        (AttentionDecoder.forward). The encoder sees each image once."""
        annotations = source if self.encoder is None else self.encoder(source)[0]  # [B, L, D]
        if repeats > 1:
            annotations = annotations.repeat_interleave(repeats, dim=0)  # [B*repeats, L, D]
        return self.decoder(annotations, inputs, lengths=lengths, draws=draws)

    @classmethod
    def from_config(cls, config: Config, *, vocab_size: int, grid: tuple[int, int] | None = None) -> EncoderDecoder:
        encoder = Encoder.from_config(config.encoder)
        decoder = build_decoder(config.model, vocab_size=vocab_size, annotation_dim=encoder.dim, grid=grid)
        return cls(encoder=encoder, decoder=decoder)

    def placed(self, device: torch.device) -> EncoderDecoder:
        """On `device` in eval mode; on a CPU the encoder's weights in channels-last layout (see `encode`)."""
        self.to(device).eval()
        if device.type == "cpu":
            self.encoder.to(memory_format=torch.channels_last)
        return self

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """pixels [B, 3, S, S] -> annotations [B, L, D] and the grid (Hg, Wg). On a CPU a few images
        at a time in channels-last layout: measured on 2 cores, that encodes twice as many images
        per second as one batch of 16 in the default layout (docs/benchmarks.md, "Captioning a folder")."""
        if pixels.device.type != "cpu":
            return self.encoder(pixels)
        pixels = pixels.contiguous(memory_format=torch.channels_last)
        parts = [self.encoder(pixels[i:i + CPU_ENCODER_CHUNK]) for i in range(0, len(pixels), CPU_ENCODER_CHUNK)]
        return torch.cat([annotations for annotations, _ in parts]), parts[0][1]

    @torch.no_grad()
    def caption(self, pixels: torch.Tensor, *, beam_size: int = 1, max_length: int = 20,
                length_penalty: float = 0.0, no_repeat_ngram: int = 0, allow_unk: bool = False,
                hard_choice: str | None = None) -> tuple[Captions, tuple[int, int]]:
        """Captions for normalized images [B, 3, S, S] (captioning.model.decoding.decode), and the grid."""
        annotations, grid = self.encode(pixels)  # [B, L, D]
        captions = decode(self.decoder, annotations, beam_size=beam_size, max_length=max_length,
                          length_penalty=length_penalty, no_repeat_ngram=no_repeat_ngram, allow_unk=allow_unk,
                          hard_choice=hard_choice)
        return captions, grid
