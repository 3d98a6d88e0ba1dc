"""Which accelerator a decoder gets: the builder's choice (captioning.model.encoder_decoder.build_decoder),
never the decoder's, which only asks whether it holds one.

One accelerator so far, the fused path (captioning.model.fused): for the paper's default decoder,
soft attention with the additive score, the same equations arranged for speed with a hand-written
backward. Before its first use on a decoder, in a process, each of its two computations checks
itself against the decoder's step-by-step path on a tiny batch (captioning.model.fused_check): a
difference stops the run with one line that names it and the way out, model.fused=false.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from captioning.model import fused, fused_check
from captioning.model.paper import AttentionDecoder, Memory
from captioning.model.state import DecoderState


class Accelerator(Protocol):
    """A faster computation of some decoders' steps (FusedPath below), handed
    to a decoder by its builder: the decoder asks it for its teacher-forced recurrence, decoding for a
    step that each image's rows share. Each checks itself against the step-by-step path before its
    first use."""

    def recurrence(self, decoder: AttentionDecoder, memory: Memory, state: DecoderState, embedded: torch.Tensor,
                   batch_sizes: list[int], *, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As `stepwise_recurrence`, for soft attention: h [N, H], z [N, D], alpha [N, L]. `like`: the
        batch's annotations [B, L, D], what its first-use check is shaped as."""

    def grouped_step(self, decoder: AttentionDecoder, memory: Memory, *, group: int, like: torch.Tensor
                     ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
        """One decoding step for `group` rows per image that share the image's memory:
        (h, c [B*group, H], tokens [B*group]) -> logits [B*group, V], h, c, alpha [B*group, L]."""


def _still_supported(decoder: AttentionDecoder) -> None:
    """A decoder whose seams were swapped after it was built (another score, attention or query) is
    no longer one the fused path computes: stop rather than compute the old equations."""
    if not fused.supports(decoder):
        raise fused_check.FastPathError(
            "model.fused: this decoder's attention or query is no longer soft attention with the additive score "
            "that its fused path was chosen for; set its accelerator to None or build it again")


class FusedPath:
    """The fused recurrence (teacher forcing) and grouped step (greedy and beam search), each proven
    once per decoder before it computes (Accelerator)."""

    def recurrence(self, decoder: AttentionDecoder, memory: Memory, state: DecoderState, embedded: torch.Tensor,
                   batch_sizes: list[int], *, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _still_supported(decoder)
        fused_check.prove_recurrence(decoder, like)  # once per decoder: both paths, a tiny batch
        return fused.recurrence(decoder, memory, state, embedded, batch_sizes)

    def grouped_step(self, decoder: AttentionDecoder, memory: Memory, *, group: int, like: torch.Tensor
                     ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
        _still_supported(decoder)
        fused_check.prove_grouped_step(decoder, like)  # once per decoder
        return fused.GroupedStep(decoder, keys=memory.keys, annotations=memory.annotations, group=group)


def accelerator_for(decoder: AttentionDecoder, *, enabled: bool = True) -> FusedPath | None:
    """The fused path for a decoder it computes (fused.supports: the paper's query, soft attention
    with the additive score), where `enabled` (model.fused); None: the decoder runs step by step."""
    return FusedPath() if enabled and fused.supports(decoder) else None
