"""The LSTM decoder that attends over the annotation grid at every word (paper Sec. 3.1.2).

Notation: B batch, T caption steps, L grid cells, D annotation channels, E embedding size,
H hidden size, V vocabulary size.

One step t, given the previous word y_{t-1} and state (h_{t-1}, c_{t-1}):
  alpha_t, z_t = attention(a, h_{t-1})              Eqs. 4-6
  z_t          = beta_t * z_t,  beta_t = sigmoid(f_beta(h_{t-1}))      Sec. 4.2.1
  h_t, c_t     = LSTM([E y_{t-1}; z_t], (h_{t-1}, c_{t-1}))            Eqs. 1-3
  p(y_t)       ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))               Eq. 7 (deep output)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from captioning.attention import AttentionOutput, Memory


@dataclass
class DecoderState:
    h: torch.Tensor  # [B, H]
    c: torch.Tensor  # [B, H]

    def select(self, index: torch.Tensor) -> DecoderState:
        return DecoderState(self.h.index_select(0, index), self.c.index_select(0, index))


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # [B, T, V]
    alphas: torch.Tensor  # [B, T, L]
    log_probs: torch.Tensor | None = None  # [B, T], hard attention's log p(s_t | a); 0 where it used the expectation
    entropies: torch.Tensor | None = None  # [B, T], hard attention's H[alpha_t]
    locations: torch.Tensor | None = None  # [B, T] long, hard attention's s_t; -1 where it used the expectation


class AttentionDecoder(nn.Module):
    def __init__(self, *, vocab_size: int, annotation_dim: int, embed_dim: int, hidden_dim: int,
                 attention: nn.Module, gate: str = "scalar", dropout: float = 0.3):
        super().__init__()
        self.attention = attention
        self.embed = nn.Embedding(vocab_size, embed_dim)  # E
        # h_0 and c_0 from the mean annotation through two separate layers (Sec. 3.1.2).
        self.init_h = nn.Linear(annotation_dim, hidden_dim)
        self.init_c = nn.Linear(annotation_dim, hidden_dim)
        if gate not in ("scalar", "vector"):
            raise ValueError(f"unknown gate '{gate}' (known: scalar, vector)")
        # The paper's beta_t is a scalar per step; some ports gate each channel instead.
        self.gate = nn.Linear(hidden_dim, 1 if gate == "scalar" else annotation_dim)
        self.lstm = nn.LSTMCell(embed_dim + annotation_dim, hidden_dim)
        self.out_h = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_z = nn.Linear(annotation_dim, embed_dim, bias=False)  # L_z
        self.out = nn.Linear(embed_dim, vocab_size)  # L_o
        self.dropout = nn.Dropout(dropout)

    def prepare(self, annotations: torch.Tensor) -> tuple[Memory, DecoderState]:
        """The per-image work: attention keys and the initial state, from annotations [B, L, D]."""
        mean = annotations.mean(dim=1)  # [B, D]
        state = DecoderState(h=torch.tanh(self.init_h(mean)), c=self.init_c(mean))
        return self.attention.prepare(annotations), state

    def _advance(self, memory: Memory, state: DecoderState,
                 embedded: torch.Tensor) -> tuple[DecoderState, torch.Tensor, AttentionOutput]:
        """One recurrence step: attend with h_{t-1}, gate, update the LSTM. embedded [B, E]."""
        attended = self.attention(memory, state.h)
        z = torch.sigmoid(self.gate(state.h)) * attended.context  # [B, D], beta_t * z_t
        h, c = self.lstm(torch.cat([embedded, z], dim=1), (state.h, state.c))
        return DecoderState(h, c), z, attended

    def _output(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output layer, Eq. 7; works on [B, E] or [B, T, E] alike."""
        return self.out(self.dropout(embedded + self.out_h(self.dropout(h)) + self.out_z(z)))

    def step(self, memory: Memory, state: DecoderState,
             tokens: torch.Tensor) -> tuple[torch.Tensor, DecoderState, AttentionOutput]:
        """One word for decoding: previous tokens [B] -> logits [B, V], new state, attention."""
        embedded = self.embed(tokens)  # [B, E]
        state, z, attended = self._advance(memory, state, embedded)
        return self._output(embedded, state.h, z), state, attended

    def forward(self, annotations: torch.Tensor, inputs: torch.Tensor) -> DecoderOutput:
        """Teacher forcing: annotations [B, L, D], input tokens [B, T] (<start> w1 .. w_{T-1}).

        The recurrence runs over the whole batch at every step; padded steps are computed and then
        masked out of the loss, which is cheaper than re-slicing the batch at each step. The output
        layer, which does not feed back, runs once over all steps.
        """
        memory, state = self.prepare(annotations)
        embedded = self.embed(inputs)  # [B, T, E]
        hs, zs, steps = [], [], []
        for t in range(inputs.shape[1]):
            state, z, attended = self._advance(memory, state, embedded[:, t])
            hs.append(state.h)
            zs.append(z)
            steps.append(attended)
        logits = self._output(embedded, torch.stack(hs, 1), torch.stack(zs, 1))  # [B, T, V]

        def stacked(name: str) -> torch.Tensor | None:
            """One AttentionOutput field over the steps, [B, T, ...]; None where attention leaves it empty."""
            values = [getattr(s, name) for s in steps]
            return None if values[0] is None else torch.stack(values, 1)

        return DecoderOutput(logits=logits, alphas=stacked("alpha"), log_probs=stacked("log_prob"),
                             entropies=stacked("entropy"), locations=stacked("location"))
