"""The batches of an epoch: shuffled, length-bucketed, split across processes, a pure function of
(seed, epoch), so that a resumed run can skip exactly the batches it already did.

Bucketing: captions of similar length in one batch waste fewer padded decoder steps. The epoch's
random order is cut into pools of `pool` batches; each pool is sorted by length and cut into
batches; the batches are shuffled again, so consecutive batches are not ordered by length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def epoch_batches(lengths: Sequence[int], *, batch_size: int, seed: int, epoch: int, bucket: bool = True,
                  pool: int = 50) -> list[list[int]]:
    """The global batches of one epoch, as lists of item indices."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=generator)
    if not bucket:
        return [b.tolist() for b in order.split(batch_size)]
    lengths_t = torch.as_tensor(np.asarray(lengths, dtype=np.int64))
    batches = []
    for chunk in order.split(batch_size * pool):
        ranked = chunk[torch.argsort(lengths_t[chunk], stable=True)]  # ties keep the random order
        batches += [b.tolist() for b in ranked.split(batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def rank_batches(batches: list[list[int]], *, rank: int, world_size: int) -> list[list[int]]:
    """This process's part of every global batch: contiguous, near-equal slices, one per global batch
    whatever the number of processes, so that a run resumes at the same global batch on more or fewer
    processes. A global batch with fewer items than processes leaves some slices empty; those
    processes take part in the step with nothing of their own (captioning.runtime.distributed)."""
    if world_size == 1:
        return batches
    return [batch[len(batch) * rank // world_size: len(batch) * (rank + 1) // world_size] for batch in batches]
