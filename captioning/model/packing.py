"""Teacher forcing over a batch of captions of several lengths: the recurrence of the paper's decoder
(captioning.model.paper.AttentionDecoder._advance) run only on the rows still running at each step.

Notation: B batch, T caption steps, L grid cells, D annotation channels, E embedding size, H hidden
size, V vocabulary size, N real (unpadded) positions of a batch.

Rows are sorted by caption length, longest first, so the rows still running at step t are a prefix
of the batch (a view, never a copy), and positions are taken time-major, like a PackedSequence
(`Packing`). The output layer (Eq. 7), the largest product, then runs once over the N real
positions. The recurrence is the decoder's accelerator's where the builder gave it one (the fused
path, captioning.model.fused), `_advance` step by step otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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
    """The packing of a batch of `batch` rows whose real steps are `lengths` [B] (None: all `steps`,
    known without a trip to the host, so that a captured graph can hold it: captioning.train.graphed)."""
    if lengths is None:
        order = torch.arange(batch, device=device)  # [B]
        step_of = torch.arange(steps, device=device).repeat_interleave(batch)  # [N = T B], time-major
        row_of = order.repeat(steps)  # [N]
        return Packing(order=order, in_order=True, batch_sizes=[batch] * steps, step_of=step_of, row_of=row_of,
                       places=row_of * steps + step_of, steps=steps)
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


def teacher_forced(decoder: Any, annotations: torch.Tensor, inputs: torch.Tensor, *, lengths: torch.Tensor | None,
                   draws: Any) -> dict[str, torch.Tensor | None]:
    """The decoder's teacher-forced forward (AttentionDecoder.forward): annotations [B, L, D], inputs
    [B, T] -> a DecoderOutput's fields, [B, T, ...] in the batch's own row order, with zeros
    (locations -1) at steps past a row's length."""
    packing = pack_by_length(lengths, batch=inputs.shape[0], steps=inputs.shape[1], device=inputs.device)
    annotations, inputs = packing.sort(annotations), packing.sort(inputs)
    if draws is not None and not packing.in_order:
        draws = draws.select(packing.order)
    embedded = decoder.embed(packing.positions(inputs))  # [N, E], E y_{t-1} at the real positions only
    memory, state = decoder.start(annotations, draws=draws)
    if decoder.accelerator is not None:
        hs, zs, alphas = decoder.accelerator.recurrence(decoder, memory, state, embedded, packing.batch_sizes,
                                                        like=annotations)
        hard: dict[str, torch.Tensor | None] = {"log_prob": None, "entropy": None, "location": None}
    else:
        hs, zs, alphas, hard = stepwise_recurrence(decoder, memory, state, embedded, packing.batch_sizes)
    logits = decoder.word_logits(embedded, hs, zs)  # [N, V], Eq. 7 once over all real positions
    return {
        "logits": packing.unpack(logits),  # [B, T, V]
        "alphas": packing.unpack(alphas),  # [B, T, L]
        "log_probs": packing.unpack(hard["log_prob"]),  # [B, T], hard attention only
        "entropies": packing.unpack(hard["entropy"]),  # [B, T]
        "locations": packing.unpack(hard["location"], fill=-1),  # [B, T], -1: no cell chosen
    }


def stepwise_recurrence(decoder: Any, memory: Any, state: Any, embedded: torch.Tensor, batch_sizes: list[int]
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
        state, z, attended = decoder._advance(memory, state, embedded[start:start + n])
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
