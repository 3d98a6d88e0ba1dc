"""The additive score (Eq. 4, Sec. 4.2) as Triton kernels, for the fused path on a GPU
(captioning.model.fused): e_ti = v . tanh(W_a a_i + W_h h_{t-1}) without the [n, L, A] tensor
tanh(.) ever written to memory.

Notation: B images, n rows (the running prefix of a step, or K beams per image), L cells, A
attention size, N packed positions (time-major, as model/packing.py packs them), T steps.

Unfused, a step writes tanh(keys + query) [n, L, A] and reads it back for its product with v,
and its backward writes and reads it several times more (its square, the keys' gradient summed in
place): at B = 512 and 14x14x512 annotations that is about 1.5 GB a step, most of the step's bytes.
Fused, the forward and the query's gradient read the keys [n, L, A] once a step and write [n, L] or
[n, A]; the keys' gradient and v's, sums over all steps, are one kernel after the backward's loop,
which reads the keys once for all steps. Every sum is in float32, whatever the keys' dtype.

tanh(x) is sign(x) (1 - e) / (1 + e), e = exp(-2|x|): one exponential, no overflow, within a few
1e-7 of tanh in float32, absolutely.
TRITON_INTERPRET=1 runs the kernels on a CPU, in numpy: tests/model/test_score_kernels.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_L, BLOCK_A = 32, 128  # cells and attention units per program; masked at the edges


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))  # in (0, 1]: no overflow for any x
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _score_kernel(keys, query, v, out, cells, att, group, BLOCK_L: tl.constexpr, BLOCK_A: tl.constexpr):
    """out[r, l] = sum_a v[a] tanh(keys[r // group, l, a] + query[r, a]); one program per (row, cell block)."""
    row, block = tl.program_id(0), tl.program_id(1)
    ls = block * BLOCK_L + tl.arange(0, BLOCK_L)
    in_l = ls < cells
    image = row // group
    total = tl.zeros([BLOCK_L], dtype=tl.float32)
    for start in range(0, att, BLOCK_A):
        units = start + tl.arange(0, BLOCK_A)
        in_a = units < att
        q = tl.load(query + row * att + units, mask=in_a, other=0.0).to(tl.float32)
        w = tl.load(v + units, mask=in_a, other=0.0).to(tl.float32)
        k = tl.load(keys + image * cells * att + ls[:, None] * att + units[None, :],
                    mask=in_l[:, None] & in_a[None, :], other=0.0).to(tl.float32)
        total += tl.sum(_tanh(k + q[None, :]) * w[None, :], axis=1)
    tl.store(out + row * cells + ls, total, mask=in_l)


@triton.jit
def _query_grad_kernel(keys, query, v, d_e, out, cells, att, BLOCK_L: tl.constexpr, BLOCK_A: tl.constexpr):
    """out[r, a] = v[a] sum_l d_e[r, l] (1 - tanh^2(keys[r, l, a] + query[r, a])); one program per (row, unit block)."""
    row, block = tl.program_id(0), tl.program_id(1)
    units = block * BLOCK_A + tl.arange(0, BLOCK_A)
    in_a = units < att
    q = tl.load(query + row * att + units, mask=in_a, other=0.0).to(tl.float32)
    total = tl.zeros([BLOCK_A], dtype=tl.float32)
    for start in range(0, cells, BLOCK_L):
        ls = start + tl.arange(0, BLOCK_L)
        in_l = ls < cells
        k = tl.load(keys + row * cells * att + ls[:, None] * att + units[None, :],
                    mask=in_l[:, None] & in_a[None, :], other=0.0).to(tl.float32)
        de = tl.load(d_e + row * cells + ls, mask=in_l, other=0.0)
        t = _tanh(k + q[None, :])
        total += tl.sum(de[:, None] * (1.0 - t * t), axis=0)
    w = tl.load(v + units, mask=in_a, other=0.0).to(tl.float32)
    tl.store(out + row * att + units, total * w, mask=in_a)


@triton.jit
def _keys_grad_kernel(keys, queries, d_es, v, offsets, sizes, grad_keys, grad_v_parts, cells, att, steps,
                      BLOCK_L: tl.constexpr, BLOCK_A: tl.constexpr):
    """Over every step t at which image b runs (b < sizes[t]), at packed position p = offsets[t] + b:
    grad_keys[b, l, a] = v[a] sum_t d_es[p, l] (1 - tanh^2), and this program's part of grad_v[a] =
    sum_t sum_l d_es[p, l] tanh, with tanh = tanh(keys[b, l, a] + queries[p, a]). The keys tile is
    read once for all steps; one program per (image, cell block, unit block)."""
    image, cell_block, unit_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ls = cell_block * BLOCK_L + tl.arange(0, BLOCK_L)
    units = unit_block * BLOCK_A + tl.arange(0, BLOCK_A)
    in_l, in_a = ls < cells, units < att
    tile = in_l[:, None] & in_a[None, :]
    k = tl.load(keys + image * cells * att + ls[:, None] * att + units[None, :], mask=tile, other=0.0).to(tl.float32)
    keys_total = tl.zeros([BLOCK_L, BLOCK_A], dtype=tl.float32)
    v_total = tl.zeros([BLOCK_A], dtype=tl.float32)
    for t in range(0, steps):
        running = image < tl.load(sizes + t)
        position = tl.load(offsets + t) + image
        q = tl.load(queries + position * att + units, mask=in_a & running, other=0.0).to(tl.float32)
        de = tl.load(d_es + position * cells + ls, mask=in_l & running, other=0.0)
        th = _tanh(k + q[None, :])
        keys_total += de[:, None] * (1.0 - th * th)
        v_total += tl.sum(de[:, None] * th, axis=0)
    w = tl.load(v + units, mask=in_a, other=0.0).to(tl.float32)
    tl.store(grad_keys + image * cells * att + ls[:, None] * att + units[None, :],
             (keys_total * w[None, :]).to(grad_keys.dtype.element_ty), mask=tile)
    tl.store(grad_v_parts + (image * tl.num_programs(1) + cell_block) * att + units, v_total, mask=in_a)


def score(keys: torch.Tensor, query: torch.Tensor, v: torch.Tensor, *, group: int = 1) -> torch.Tensor:
    """e [n, L] float32 = v . tanh(keys[r // group] + query[r]): keys [B, L, A], query [n, A], v [A],
    n <= B * group (the running prefix, or `group` rows per image)."""
    rows, (_, cells, att) = query.shape[0], keys.shape
    keys, query, v = keys.contiguous(), query.contiguous(), v.contiguous()
    out = torch.empty(rows, cells, device=keys.device, dtype=torch.float32)
    _score_kernel[(rows, triton.cdiv(cells, BLOCK_L))](keys, query, v, out, cells, att, group,
                                                        BLOCK_L=BLOCK_L, BLOCK_A=BLOCK_A)
    return out


def query_grad(keys: torch.Tensor, query: torch.Tensor, v: torch.Tensor, d_e: torch.Tensor) -> torch.Tensor:
    """d e / d query, contracted with d_e [n, L] float32: [n, A] float32. keys [>= n, L, A], query [n, A]."""
    rows, (_, cells, att) = query.shape[0], keys.shape
    keys, query, v, d_e = keys.contiguous(), query.contiguous(), v.contiguous(), d_e.contiguous()
    out = torch.empty(rows, att, device=keys.device, dtype=torch.float32)
    _query_grad_kernel[(rows, triton.cdiv(att, BLOCK_A))](keys, query, v, d_e, out, cells, att,
                                                           BLOCK_L=BLOCK_L, BLOCK_A=BLOCK_A)
    return out


def keys_and_v_grads(keys: torch.Tensor, queries: torch.Tensor, d_es: torch.Tensor, v: torch.Tensor,
                     batch_sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys' gradient [B, L, A] (their dtype) and v's [A] (float32), summed over every step: keys
    [B, L, A], queries [N, A] and d_es [N, L] float32 packed, n_t in `batch_sizes`."""
    batch, cells, att = keys.shape
    steps = len(batch_sizes)
    device = keys.device
    if all(n == batch for n in batch_sizes):  # every row every step (a captured graph's): no copy from the host
        sizes = torch.full((steps,), batch, dtype=torch.int64, device=device)
        offsets = torch.arange(steps, device=device) * batch
    else:
        sizes = torch.tensor(batch_sizes, dtype=torch.int64).to(device, non_blocking=True)
        offsets = torch.cumsum(sizes, 0) - sizes
    keys, queries, d_es, v = keys.contiguous(), queries.contiguous(), d_es.contiguous(), v.contiguous()
    grad_keys = torch.empty_like(keys)
    cell_blocks = triton.cdiv(cells, BLOCK_L)
    parts = torch.empty(batch * cell_blocks, att, device=device, dtype=torch.float32)
    _keys_grad_kernel[(batch, cell_blocks, triton.cdiv(att, BLOCK_A))](
        keys, queries, d_es, v, offsets, sizes, grad_keys, parts, cells, att, steps, BLOCK_L=BLOCK_L, BLOCK_A=BLOCK_A)
    return grad_keys, parts.sum(0)
