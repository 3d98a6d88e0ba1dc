"""Captioner = pretrained encoder + attention decoder, built from a config.

Notation: B batch, S input side, L grid cells, D annotation channels.
"""

from __future__ import annotations

import torch
from torch import nn

from captioning.config import Config
from captioning.model.attention import build_attention
from captioning.model.decoder import AttentionDecoder
from captioning.model.decoding import Captions, decode
from captioning.model.encoder import Encoder, build_encoder


def build_decoder(config: Config, *, vocab_size: int, annotation_dim: int,
                  grid: tuple[int, int] | None = None) -> AttentionDecoder:
    """`grid` (Hg, Wg) is needed by the location and local scores and the learned 2-D position."""
    m = config.model
    shared = {"score": m.score, "annotation_dim": annotation_dim, "attention_dim": m.attention_dim, "grid": grid,
              "temperature": m.temperature, "position": m.position, "local_base": m.local_base,
              "local_window": m.local_window, "local_sigma": m.local_sigma, "cosine_sharpness": m.cosine_sharpness,
              "unit_annotations": m.unit_annotations}
    query_dim = m.hidden_dim + (m.embed_dim if m.query_word else 0)  # h_{t-1}, or [h_{t-1}; E y_{t-1}]
    attention = build_attention(kind=m.attention, hidden_dim=query_dim, **shared,
                                expectation_prob=m.hard_expectation_prob, coin=m.hard_coin, warmup=m.hard_warmup,
                                group=config.train.samples)  # train_step's copies of each caption
    glimpse = None
    if m.glimpses == 2:  # queried with [query; z_t], so its "hidden" side is the query's + the context's width
        glimpse = build_attention(kind="soft", hidden_dim=query_dim + annotation_dim + attention.extra_channels,
                                  **shared)
    return AttentionDecoder(vocab_size=vocab_size, annotation_dim=annotation_dim, embed_dim=m.embed_dim,
                            hidden_dim=m.hidden_dim, attention=attention, gate=m.gate, dropout=m.dropout,
                            deep_output=m.deep_output, layout_cells=_layout_cells(m.init, grid), glimpse=glimpse,
                            query_word=m.query_word)


def _layout_cells(init: str, grid: tuple[int, int] | None) -> int:
    """model.init=layout needs the grid's size; the paper's mean does not."""
    if init == "mean":
        return 0
    if grid is None:
        raise ValueError("model.init=layout needs the annotation grid (Hg, Wg)")
    return grid[0] * grid[1]


class Captioner(nn.Module):
    def __init__(self, *, encoder: Encoder, decoder: AttentionDecoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    @classmethod
    def from_config(cls, config: Config, *, vocab_size: int, grid: tuple[int, int] | None = None) -> Captioner:
        e = config.encoder
        encoder = build_encoder(name=e.name, layer=e.layer, weights_path=e.weights_path, padding=e.padding)
        decoder = build_decoder(config, vocab_size=vocab_size, annotation_dim=encoder.dim, grid=grid)
        return cls(encoder=encoder, decoder=decoder)

    @torch.no_grad()
    def generate(self, images: torch.Tensor, *, beam_size: int = 1, max_length: int = 20,
                 length_penalty: float = 0.0, hard_attention: str | None = None) -> tuple[Captions, tuple[int, int]]:
        """Captions for normalized images [B, 3, S, S], and the attention grid (Hg, Wg)."""
        annotations, grid = self.encoder(images)  # [B, L, D]
        captions = decode(self.decoder, annotations, beam_size=beam_size, max_length=max_length,
                          length_penalty=length_penalty, hard_attention=hard_attention)
        return captions, grid
