"""The LSTM decoder that attends over the annotation grid at every word (paper Sec. 3.1.2).

Notation: B batch, T caption steps, L grid cells, D annotation channels, E embedding size,
H hidden size, V vocabulary size.

One step t, given the previous word y_{t-1} and state (h_{t-1}, c_{t-1}):
  alpha_t, z_t = attention(a, q_t),  q_t = h_{t-1}  Eqs. 4-6
  (model.query_word: q_t = [h_{t-1}; E y_{t-1}], the query also sees the previous word)
  (model.glimpses=2: z_t = [z_t; z'_t], z'_t = glimpse(a, [q_t; z_t]), a second soft attention)
  z_t          = beta_t * z_t,  beta_t = sigmoid(f_beta(h_{t-1}))      Sec. 4.2.1
  h_t, c_t     = LSTM([E y_{t-1}; z_t], (h_{t-1}, c_{t-1}))            Eqs. 1-3
  p(y_t)       ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))               Eq. 7 (deep output)

Eq. 7 as printed is linear in h_t and z_t; the authors' code (arctic-captions, capgen.py) puts a
tanh before L_o, which makes it a one-hidden-layer network: deep_output="tanh". The difference
matters for words that are not a linear function of the state: "to" (of "to the left/right of")
must be likelier than "above" and "below" when |dx| > |dy|, which no linear read-out of positions
gives (docs/attention.md measures it).

A second glimpse (not in the paper) is for the same word: "A to the left of B" is decided at the
word "to", before B is named, and a single map at that word would have to cover both A and B. The second
glimpse's query includes what the first one saw, so it can look *elsewhere*; with the grid
coordinates appended (model.position=coordinates) z_t then holds both places. On the shapes data,
with the local score and 16 epochs, it helps the decoder choose a relation before naming B, by an
amount that varies with the seed, and relations stay far from solved (docs/attention.md). Measured
at the relation word, the two maps do not split into a first one on A and a second on B; caption by
caption, each puts most of its mass inside the objects on one of them (benchmarks/relation_errors.py).
The map the decoder reports for a word (alphas: overlays, attention correctness, the doubly
stochastic term) is the mean of the two glimpses' maps, still a distribution over the L cells, as
the maps of several attention heads are often averaged to show them. Both glimpses' contexts feed
the word, and which of them looks at the object being named is not fixed by the architecture: it
is the first on most seeds and the second on some (seed 5 of six of
configs/shapes_relations_16ep.yaml), so the first glimpse's map alone would show where the decoder
looked on some models and not on others (docs/attention.md).
benchmarks/glimpses_at_relation.py scores each glimpse's map on its own.

The word in the query (not in the paper). In Eq. 4 the map for y_t is computed from h_{t-1}, the
state that predicted y_{t-1}, before that word was chosen: after "a red" the map for the next word
comes from a state that weighed "red" against "yellow" but does not know which was said, so with a
red and a yellow square in the image the map for "square" cannot look for the red one. On the
shapes data that map puts more mass on the red square than on the yellow one for 69% of such
captions, and for 99 to 100% with model.query_word=true, which queries with [h_{t-1}; E y_{t-1}] as
the attention LSTM of Anderson et al. (2018) reads the previous word before it attends. With it the
stated relations of configs/shapes_relations_16ep.yaml (before its narrower window and dropout 0.1)
hold 88 to 90% of the time over four seeds, against 76 to 86% over three without (docs/attention.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from captioning.model import fused
from captioning.model.attention import AttentionOutput, Memory


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
                 attention: nn.Module, gate: str = "scalar", dropout: float = 0.3, deep_output: str = "linear",
                 layout_cells: int = 0, layout_dim: int = 8, glimpse: nn.Module | None = None,
                 query_word: bool = False):
        super().__init__()
        self.attention = attention
        self.glimpse = glimpse  # a second soft attention per word, queried with [q_t; z_t]; or None
        self.query_word = query_word  # attention queried with [h_{t-1}; E y_{t-1}] rather than h_{t-1}
        self.embed = nn.Embedding(vocab_size, embed_dim)  # E
        # h_0 and c_0 from the mean annotation through two separate layers (Sec. 3.1.2). The mean
        # is the same for any permutation of the cells: it says what is in the image, not where. A
        # caption "A <relation> B" names the relation before it names B, so a decoder that has not
        # yet looked at B needs the layout in its state: with layout_cells = L, each cell is also
        # projected to layout_dim channels and the L * layout_dim of them, in grid order, join the
        # mean (an option, model.init=layout; not in the paper).
        self.layout = nn.Linear(annotation_dim, layout_dim) if layout_cells else None
        summary_dim = annotation_dim + layout_cells * layout_dim
        self.init_h = nn.Linear(summary_dim, hidden_dim)
        self.init_c = nn.Linear(summary_dim, hidden_dim)
        if gate not in ("scalar", "vector"):
            raise ValueError(f"unknown gate '{gate}' (known: scalar, vector)")
        # z_t is as wide as attention's memory: D, or D + 2 with the grid coordinates appended; twice
        # that with a second glimpse.
        context_dim = (annotation_dim + getattr(attention, "extra_channels", 0)) * (1 if glimpse is None else 2)
        # The paper's beta_t is a scalar per step; some ports gate each channel instead.
        self.gate = nn.Linear(hidden_dim, 1 if gate == "scalar" else context_dim)
        self.lstm = nn.LSTMCell(embed_dim + context_dim, hidden_dim)
        self.out_h = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_z = nn.Linear(context_dim, embed_dim, bias=False)  # L_z
        self.out = nn.Linear(embed_dim, vocab_size)  # L_o
        if deep_output not in ("linear", "tanh"):
            raise ValueError(f"unknown deep_output '{deep_output}' (known: linear, tanh)")
        self.deep_output = deep_output
        self.dropout = nn.Dropout(dropout)

    def prepare(self, annotations: torch.Tensor) -> tuple[Memory, DecoderState]:
        """The per-image work: attention keys and the initial state, from annotations [B, L, D]."""
        summary = annotations.mean(dim=1)  # [B, D]
        if self.layout is not None:
            summary = torch.cat([summary, self.layout(annotations).flatten(1)], dim=1)  # [B, D + L * layout_dim]
        state = DecoderState(h=torch.tanh(self.init_h(summary)), c=self.init_c(summary))
        memory = self.attention.prepare(annotations)
        if self.glimpse is not None:
            memory.glimpse = self.glimpse.prepare(annotations)
        return memory, state

    @property
    def fusable(self) -> bool:
        """Whether the fused recurrence (captioning.model.fused) computes this decoder's steps."""
        return self.glimpse is None and not self.query_word and fused.supports(self.attention)

    def _advance(self, memory: Memory, state: DecoderState,
                 embedded: torch.Tensor) -> tuple[DecoderState, torch.Tensor, AttentionOutput]:
        """One recurrence step: attend with h_{t-1} (and y_{t-1}), gate, update the LSTM. embedded [B, E]."""
        query = torch.cat([state.h, embedded], dim=1) if self.query_word else state.h  # [B, H (+ E)]
        attended = self.attention(memory, query)
        context = attended.context  # [B, D]
        if self.glimpse is not None:
            second = self.glimpse(memory.glimpse, torch.cat([query, context], dim=1))
            context = torch.cat([context, second.context], dim=1)  # [B, 2D]
            attended = replace(attended, alpha=(attended.alpha + second.alpha) / 2)  # [B, L], the reported map
        z = torch.sigmoid(self.gate(state.h)) * context  # [B, D] (2D with a glimpse), beta_t * z_t
        h, c = self.lstm(torch.cat([embedded, z], dim=1), (state.h, state.c))
        return DecoderState(h, c), z, attended

    def _output(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output layer, Eq. 7; works on [B, E] or [B, T, E] alike."""
        hidden = embedded + self.out_h(self.dropout(h)) + self.out_z(z)
        if self.deep_output == "tanh":
            hidden = torch.tanh(hidden)
        return self.out(self.dropout(hidden))

    def step(self, memory: Memory, state: DecoderState,
             tokens: torch.Tensor) -> tuple[torch.Tensor, DecoderState, AttentionOutput]:
        """One word for decoding: previous tokens [B] -> logits [B, V], new state, attention."""
        embedded = self.embed(tokens)  # [B, E]
        state, z, attended = self._advance(memory, state, embedded)
        return self._output(embedded, state.h, z), state, attended

    def forward(self, annotations: torch.Tensor, inputs: torch.Tensor, *,
                lengths: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing: annotations [B, L, D], input tokens [B, T] (<start> w1 .. w_{T-1}).

        lengths [B] (optional): the real steps of each row (targets that are not padding). Steps at or
        past a row's length are then not computed at all, and their logits and alphas come back as
        zeros (the loss masks them anyway); without it every step of every row is computed.

        Rows are sorted by length, longest first, so that the rows still running at step t are a
        prefix of the batch (a view, never a copy), and the recurrence shrinks as captions end. Only
        the recurrence runs step by step: the output layer (Eq. 7), the largest product, runs once
        over the real positions, packed. Soft attention with the additive score (the paper's default)
        takes the fused path of captioning.model.fused; any other attention runs `_advance` step by step.
        """
        batch, steps = inputs.shape
        if lengths is None:
            lengths = torch.full((batch,), steps, dtype=torch.long, device=inputs.device)
        lengths = lengths.to(device=inputs.device, dtype=torch.long)
        if lengths.shape != (batch,) or bool(((lengths < 1) | (lengths > steps)).any()):
            raise ValueError(f"lengths must be [B] = [{batch}] integers in 1..{steps}")
        order = torch.argsort(lengths, descending=True, stable=True)  # [B]
        sorted_lengths = lengths[order]
        batch_sizes = (sorted_lengths[None, :] > torch.arange(int(sorted_lengths[0]), device=inputs.device)[:, None])
        batch_sizes = batch_sizes.sum(1).tolist()  # n_t, rows still running at step t
        if not bool((order == torch.arange(batch, device=order.device)).all()):
            annotations, inputs = annotations[order], inputs[order]
        # Packed position p = (step t, sorted row r < n_t), time-major like a PackedSequence.
        step_of = torch.cat([torch.full((n,), t, dtype=torch.long) for t, n in enumerate(batch_sizes)])
        row_of = torch.cat([torch.arange(n) for n in batch_sizes])
        step_of, row_of = step_of.to(inputs.device), row_of.to(inputs.device)  # [N]
        embedded = self.embed(inputs[row_of, step_of])  # [N, E], the real positions only
        memory, state = self.prepare(annotations)
        if self.fusable:
            hs, zs, alphas = self._fused_recurrence(memory, state, embedded, batch_sizes)
            hard: dict[str, torch.Tensor | None] = {"log_prob": None, "entropy": None, "location": None}
        else:
            hs, zs, alphas, hard = self._stepwise_recurrence(memory, state, embedded, batch_sizes)
        logits = self._output(embedded, hs, zs)  # [N, V], Eq. 7 once over all real positions

        where = order[row_of] * steps + step_of  # [N], packed position -> flat index into [B, T]

        def unpack(packed: torch.Tensor | None, fill: float = 0) -> torch.Tensor | None:
            """[N, ...] -> [B, T, ...], `fill` at padding (the loss masks it anyway)."""
            if packed is None:
                return None
            flat = packed.new_full((batch * steps, *packed.shape[1:]), fill).index_copy(0, where, packed)
            return flat.view(batch, steps, *packed.shape[1:])

        return DecoderOutput(
            logits=unpack(logits),  # [B, T, V]
            alphas=unpack(alphas),  # [B, T, L]
            log_probs=unpack(hard["log_prob"]),  # [B, T], hard attention only
            entropies=unpack(hard["entropy"]),  # [B, T]
            locations=unpack(hard["location"], fill=-1),  # [B, T], -1: no cell chosen
        )

    def _stepwise_recurrence(self, memory: Memory, state: DecoderState, embedded: torch.Tensor, batch_sizes: list[int]
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor | None]]:
        """Any attention: `_advance` on the running prefix of each step. embedded [N, E], packed.

        -> h [N, H], z [N, D], alpha [N, L], and hard attention's log_prob, entropy, location [N] by
        name (None for soft attention, which samples nothing).
        """
        hs, zs, steps = [], [], []
        start = 0
        for n in batch_sizes:
            if n < state.h.shape[0]:
                memory, state = memory.prefix(n), DecoderState(state.h[:n], state.c[:n])
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

    def _fused_recurrence(self, memory: Memory, state: DecoderState, embedded: torch.Tensor,
                          batch_sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Soft attention with the additive score: the same recurrence, fused. embedded [N, E], packed."""
        dtype = self.lstm.weight_ih.dtype
        # Under autocast the recurrence runs in the parameters' dtype (float32); the output layer after it
        # still runs in the autocast dtype.
        with torch.autocast(embedded.device.type, enabled=False):
            gates_x = fused.word_gates(self, embedded.to(dtype))  # [N, 4H], the word part for all steps at once
            embed_dim = embedded.shape[1]
            return fused.FusedRecurrence.apply(
                memory.keys.to(dtype), memory.annotations.to(dtype), gates_x, state.h.to(dtype), state.c.to(dtype),
                fused.hidden_weights(self), self.gate.bias, self.attention.score.v.weight.view(-1),
                self.lstm.weight_ih[:, embed_dim:], batch_sizes, torch.is_grad_enabled())
