"""Captioner = pretrained encoder + attention decoder, built from a config.

Notation: B batch, S input side, L grid cells, D annotation channels.
"""

from __future__ import annotations

import torch
from torch import nn

from captioning.attention import build_attention
from captioning.config import Config
from captioning.decoder import AttentionDecoder
from captioning.decoding import Captions, decode
from captioning.encoder import Encoder, build_encoder


def build_decoder(config: Config, *, vocab_size: int, annotation_dim: int) -> AttentionDecoder:
    m = config.model
    attention = build_attention(kind=m.attention, score=m.score, annotation_dim=annotation_dim,
                                hidden_dim=m.hidden_dim, attention_dim=m.attention_dim)
    return AttentionDecoder(vocab_size=vocab_size, annotation_dim=annotation_dim, embed_dim=m.embed_dim,
                            hidden_dim=m.hidden_dim, attention=attention, gate=m.gate, dropout=m.dropout)


class Captioner(nn.Module):
    def __init__(self, *, encoder: Encoder, decoder: AttentionDecoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    @classmethod
    def from_config(cls, config: Config, *, vocab_size: int) -> Captioner:
        e = config.encoder
        encoder = build_encoder(name=e.name, layer=e.layer, weights_path=e.weights_path)
        return cls(encoder=encoder, decoder=build_decoder(config, vocab_size=vocab_size, annotation_dim=encoder.dim))

    @torch.no_grad()
    def generate(self, images: torch.Tensor, *, beam_size: int = 1, max_length: int = 20,
                 length_penalty: float = 0.0) -> tuple[Captions, tuple[int, int]]:
        """Captions for normalized images [B, 3, S, S], and the attention grid (Hg, Wg)."""
        annotations, grid = self.encoder(images)  # [B, L, D]
        captions = decode(self.decoder, annotations, beam_size=beam_size, max_length=max_length,
                          length_penalty=length_penalty)
        return captions, grid
