"""The LSTM decoder that attends over the annotation grid at every word (paper Sec. 3.1.2).

Notation: B batch, T caption steps, L grid cells, D annotation channels, E embedding size,
H hidden size, V vocabulary size, N real (unpadded) positions of a batch.

Initial state, from a summary of the image:
  h_0 = tanh(f_init,h(mean_i a_i)),  c_0 = f_init,c(mean_i a_i)               Sec. 3.1.2
One step t, given the previous word y_{t-1} and state (h_{t-1}, c_{t-1}):
  alpha_t, z_t = attention(a, q_t),  q_t = h_{t-1}                          Eqs. 4-6
  z_t          = beta_t * z_t,  beta_t = sigmoid(f_beta(h_{t-1}))          Sec. 4.2.1
  h_t, c_t     = LSTM([E y_{t-1}; z_t], (h_{t-1}, c_{t-1}))                Eqs. 1-3
  p(y_t)       ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))                   Eq. 7 (deep output)

Eq. 7 as printed is linear in h_t and z_t; the authors' code (arctic-captions, capgen.py) puts a
tanh before L_o (deep_output="tanh"). The paper's beta_t is a scalar; some ports gate each channel
of z_t instead (gate="vector").

Three seams take the options that are not in the paper (captioning/model/extras), each a module
handed in by captioning.model.encoder_decoder: `summary`, what the initial state is computed from (the
paper: MeanAnnotation); `query`, what attention is queried with (the paper: PreviousState,
captioning.model.query); and `attention` itself (soft or hard, any score; TwoGlimpses wraps two).
This module never asks which one it holds.

Which code runs: `_advance` below is the model, one step of the equations above. For speed, the
builder may hand the decoder an *accelerator* (captioning.model.encoder_decoder.build_decoder,
captioning.model.accelerator): for soft attention with the additive score (every shipped config)
the fused path of captioning/model/fused.py, the same equations with a hand-written backward, which
checks itself against `_advance` the first time it runs (captioning.model.fused_check) and is tested
against it to float rounding. The decoder only asks whether it holds one; `model.fused=false` (or
`accelerator=None`) runs `_advance` for every config.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from captioning.model.attention import AttentionOutput, Draws, Memory
from captioning.model.query import PreviousState
from captioning.model.state import DecoderState


class MeanAnnotation(nn.Module):
    """The paper's summary of an image for the initial state: the mean annotation (Sec. 3.1.2)."""

    def __init__(self, *, annotation_dim: int):
        super().__init__()
        self.dim = annotation_dim

    def forward(self, annotations: torch.Tensor) -> torch.Tensor:
        return annotations.mean(dim=1)  # [B, D]


@dataclass
class Packing:
    """A teacher-forced batch's real positions, packed: rows sorted by caption length, longest first,
    so that the rows still running at step t are a prefix of the batch (a view, never a copy), and
    the positions taken time-major, p = (step t, sorted row r < n_t), like a PackedSequence.
    `pack_by_length` makes it; `unpack` puts packed values back in their [B, T] places."""

    order: torch.Tensor  # [B], the sorted rows' places in the batch
    in_order: bool  # whether the batch came sorted already (order is then 0 .. B-1)
    batch_sizes: list[int]  # n_t, the rows still running at step t, while any is
    step_of: torch.Tensor  # [N], each packed position's step t
    row_of: torch.Tensor  # [N], its sorted row r
    places: torch.Tensor  # [N], its place in the batch's own rows, flattened: row * T + t
    steps: int  # T

    def sort(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows [B, ...] in the packing's order."""
        return rows if self.in_order else rows[self.order]

    def positions(self, sorted_rows: torch.Tensor) -> torch.Tensor:
        """The real positions of sorted [B, T, ...] values, packed: [N, ...]."""
        return sorted_rows[self.row_of, self.step_of]

    def unpack(self, packed: torch.Tensor | None, fill: float = 0) -> torch.Tensor | None:
        """[N, ...] -> [B, T, ...] in the batch's own row order, `fill` at padding (the loss masks it)."""
        if packed is None:
            return None
        batch = self.order.shape[0]
        flat = packed.new_full((batch * self.steps, *packed.shape[1:]), fill).index_copy(0, self.places, packed)
        return flat.view(batch, self.steps, *packed.shape[1:])


def pack_by_length(lengths: torch.Tensor | None, *, batch: int, steps: int, device: torch.device) -> Packing:
    """The packing of a batch of `batch` rows whose real steps are `lengths` [B] (None: all `steps`)."""
    if lengths is None:
        lengths = torch.full((batch,), steps, dtype=torch.long, device=device)
    lengths = lengths.to(device=device, dtype=torch.long)
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must be [B] = [{batch}] integers in 1..{steps}")
    order = torch.argsort(lengths, descending=True, stable=True)  # [B]
    running = (lengths[order][None, :] > torch.arange(steps, device=device)[:, None]).sum(1)  # [T], n_t
    invalid = ((lengths < 1) | (lengths > steps)).any()
    in_order = (order == torch.arange(batch, device=device)).all()
    # The recurrence needs n_t on the host: one trip there brings the lengths' check and whether the
    # rows are sorted already with it (on a GPU, each trip waits for all the work queued before it).
    invalid, in_order, *running_host = torch.cat([torch.stack([invalid, in_order]).long(), running]).tolist()
    if invalid:
        raise ValueError(f"lengths must be [B] = [{batch}] integers in 1..{steps}")
    batch_sizes = [n for n in running_host if n > 0]
    # Made on the device from n_t there (output_size: repeat_interleave need not read the total back).
    total, running = sum(batch_sizes), running[:len(batch_sizes)]  # N, [T']
    step_of = torch.repeat_interleave(torch.arange(len(batch_sizes), device=device), running,
                                      output_size=total)  # [N]
    row_of = torch.arange(total, device=device) - (torch.cumsum(running, 0) - running)[step_of]  # [N]
    return Packing(order=order, in_order=bool(in_order), batch_sizes=batch_sizes, step_of=step_of, row_of=row_of,
                   places=order[row_of] * steps + step_of, steps=steps)


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # [B, T, V]
    alphas: torch.Tensor  # [B, T, L]
    log_probs: torch.Tensor | None = None  # [B, T], hard attention's log p(s_t | a); 0 where it used the expectation
    entropies: torch.Tensor | None = None  # [B, T], hard attention's H[alpha_t]
    locations: torch.Tensor | None = None  # [B, T] long, hard attention's s_t; -1 where it used the expectation


class Accelerator(Protocol):
    """A faster computation of some decoders' steps (captioning.model.accelerator.FusedPath), handed
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


class AttentionDecoder(nn.Module):
    def __init__(self, *, vocab_size: int, annotation_dim: int, embed_dim: int, hidden_dim: int,
                 attention: nn.Module, gate: str = "scalar", dropout: float = 0.3, deep_output: str = "linear",
                 summary: Callable[..., nn.Module] = MeanAnnotation, query: nn.Module | None = None,
                 accelerator: Accelerator | None = None):
        """`summary` builds the module the initial state is computed from (called with
        annotation_dim); `query` makes the attention query from the state (h_{t-1}) and E y_{t-1},
        and may carry something of its own from word to word in the state. `accelerator`: what
        computes the steps faster (the builder's choice: captioning.model.accelerator); None runs
        `_advance` always. It is no module of the decoder's: its weights are the decoder's own."""
        super().__init__()
        self.accelerator = accelerator
        self.annotation_dim = annotation_dim  # D: the channels of the annotations it reads
        self.attention = attention
        self.query = query if query is not None else PreviousState()
        self.embed = nn.Embedding(vocab_size, embed_dim)  # E
        self.summary = summary(annotation_dim=annotation_dim)
        self.init_h = nn.Linear(self.summary.dim, hidden_dim)  # f_init,h (Sec. 3.1.2)
        self.init_c = nn.Linear(self.summary.dim, hidden_dim)  # f_init,c
        context_dim = attention.context_dim(annotation_dim)  # the width of z_t
        self.gate = nn.Linear(hidden_dim, 1 if gate == "scalar" else context_dim)  # f_beta
        self.lstm = nn.LSTMCell(embed_dim + context_dim, hidden_dim)
        self.out_h = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_z = nn.Linear(context_dim, embed_dim, bias=False)  # L_z
        self.out = nn.Linear(embed_dim, vocab_size)  # L_o
        self.deep_output = deep_output
        self.deep = nn.Tanh() if deep_output == "tanh" else nn.Identity()  # before L_o (Eq. 7)
        self.dropout = nn.Dropout(dropout)

    def start(self, annotations: torch.Tensor, draws: Draws | None = None) -> tuple[Memory, DecoderState]:
        """The per-image work: attention keys and the initial state, from annotations [B, L, D].
        `draws`: hard attention's randomness while training, handed in by the training step."""
        summary = self.summary(annotations)  # [B, D] for the paper's mean
        state = DecoderState(h=torch.tanh(self.init_h(summary)), c=self.init_c(summary))
        return self.attention.start(annotations, draws=draws), state

    def prepare(self, annotations: torch.Tensor, draws: Draws | None = None) -> tuple[Memory, DecoderState]:
        """`start`'s old name (it is also a command), kept for scripts that call it."""
        warnings.warn("AttentionDecoder.prepare is now named start (the old name still works)", FutureWarning,
                      stacklevel=2)
        return self.start(annotations, draws=draws)

    def _advance(self, memory: Memory, state: DecoderState,
                 embedded: torch.Tensor) -> tuple[DecoderState, torch.Tensor, AttentionOutput]:
        """One recurrence step: attend, gate, update the LSTM. embedded [B, E]."""
        query, state = self.query(state, embedded)  # q_t (Eq. 4), and what the query carries on
        attended = self.attention(memory, query)  # Eqs. 4-6
        z = torch.sigmoid(self.gate(state.h)) * attended.context  # [B, D], beta_t * z_t (Sec. 4.2.1)
        h, c = self.lstm(torch.cat([embedded, z], dim=1), (state.h, state.c))  # Eqs. 1-3
        return DecoderState(h, c, state.carried), z, attended

    def word_logits(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output layer, Eq. 7; works on [B, E] or [B, T, E] alike."""
        hidden = self.deep(embedded + self.out_h(self.dropout(h)) + self.out_z(z))
        return self.out(self.dropout(hidden))

    def step(self, memory: Memory, state: DecoderState,
             tokens: torch.Tensor) -> tuple[torch.Tensor, DecoderState, AttentionOutput]:
        """One word for decoding: previous tokens [B] -> logits [B, V], new state, attention."""
        embedded = self.embed(tokens)  # [B, E]
        state, z, attended = self._advance(memory, state, embedded)
        return self.word_logits(embedded, state.h, z), state, attended

    def forward(self, annotations: torch.Tensor, inputs: torch.Tensor, *,
                lengths: torch.Tensor | None = None, draws: Draws | None = None) -> DecoderOutput:
        """Teacher forcing: annotations [B, L, D], input tokens [B, T] (<start> w1 .. w_{T-1}).

        lengths [B] (optional): the real steps of each row (targets that are not padding). Steps at or
        past a row's length are then not computed at all, and their logits and alphas come back as
        zeros (the loss masks them anyway); without it every step of every row is computed.

        draws (optional, hard attention while training): each row's coin and the uniform draws for
        its cells (captioning.model.attention.Draws), handed in by the training step.

        Only the recurrence runs step by step, on the rows still running (`Packing`): the output
        layer (Eq. 7), the largest product, runs once over the real positions. The recurrence is the
        accelerator's where the builder gave one (soft attention with the additive score, unless
        model.fused=false), `_advance` step by step otherwise.
        """
        packing = pack_by_length(lengths, batch=inputs.shape[0], steps=inputs.shape[1], device=inputs.device)
        annotations, inputs = packing.sort(annotations), packing.sort(inputs)
        if draws is not None and not packing.in_order:
            draws = draws.select(packing.order)
        embedded = self.embed(packing.positions(inputs))  # [N, E], E y_{t-1} at the real positions only
        memory, state = self.start(annotations, draws=draws)
        if self.accelerator is not None:
            hs, zs, alphas = self.accelerator.recurrence(self, memory, state, embedded, packing.batch_sizes,
                                                         like=annotations)
            hard: dict[str, torch.Tensor | None] = {"log_prob": None, "entropy": None, "location": None}
        else:
            hs, zs, alphas, hard = self.stepwise_recurrence(memory, state, embedded, packing.batch_sizes)
        logits = self.word_logits(embedded, hs, zs)  # [N, V], Eq. 7 once over all real positions
        return DecoderOutput(
            logits=packing.unpack(logits),  # [B, T, V]
            alphas=packing.unpack(alphas),  # [B, T, L]
            log_probs=packing.unpack(hard["log_prob"]),  # [B, T], hard attention only
            entropies=packing.unpack(hard["entropy"]),  # [B, T]
            locations=packing.unpack(hard["location"], fill=-1),  # [B, T], -1: no cell chosen
        )

    def stepwise_recurrence(self, memory: Memory, state: DecoderState, embedded: torch.Tensor, batch_sizes: list[int]
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor | None]]:
        """Any attention: `_advance` on the running prefix of each step. embedded [N, E], packed.

        -> h [N, H], z [N, D], alpha [N, L], and hard attention's log_prob, entropy, location [N] by
        name (None for soft attention, which samples nothing).
        """
        hs, zs, steps = [], [], []
        start = 0
        for n in batch_sizes:
            if n < state.h.shape[0]:
                memory, state = memory.prefix(n), state.prefix(n)
            state, z, attended = self._advance(memory, state, embedded[start:start + n])
            start += n
            hs.append(state.h)
            zs.append(z)
            steps.append(attended)

        def packed(name: str) -> torch.Tensor | None:
            """One AttentionOutput field over the steps, [N, ...]; None where attention leaves it empty."""
            values = [getattr(s, name) for s in steps]
            return None if values[0] is None else torch.cat(values)

        hard = {name: packed(name) for name in ("log_prob", "entropy", "location")}
        return torch.cat(hs), torch.cat(zs), packed("alpha"), hard
