"""Fast path for the paper's default decoder: soft attention with the additive score (Sec. 4.2).

Notation: B batch (rows sorted by length, longest first), T steps, n_t rows still running at step t,
N = sum_t n_t real (unpadded) positions, L grid cells, D annotation channels, A attention size,
H hidden size, G gate width (1 for the paper's scalar beta, D for the vector gate), K beams.

The recurrence is the decoder's `_advance` (Eqs. 4-6, Sec. 4.2.1, Eqs. 1-3) written out with the
same parameters, so that the work can be arranged for speed without changing the model:

- Every product with h_{t-1} (the score's query W_h h, the gate f_beta(h), the LSTM's W_hh h) is one
  matrix product per step against the stacked weights [W_h; W_beta; W_hh].
- The word part of the LSTM input, W_ih[:, :E] E y_{t-1} + biases, does not depend on the recurrence:
  the caller computes it for all steps in one product (split of LSTMCell's W_ih [E y; z]).
- Rows are sorted by length, so the rows still running at step t are a prefix: padded steps are
  never computed, and the prefix is a view, not a copy.
- Backward is written by hand (a torch.autograd.Function): the weight gradients, which autograd
  would compute as one thin product per step, are one product over all N positions at the end, and
  the gradient of the keys W_a a_i, which every step touches, is accumulated in place.
- Under bf16 autocast the products and the score's [n, L, A] tensor are bf16, and what a recurrence
  of 20 steps accumulates (the cell state, the softmax, the backward's sums over steps) stays
  float32: tests/model/test_fused_precision.py holds it to the float32 equations within bf16's
  precision. On a GPU the backward computes the score's tanh again instead of keeping [N, L, A].

`FusedRecurrence` serves teacher forcing (training); `GroupedStep` serves beam search, where the K
beams of an image share its keys and annotations instead of copying them K times.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from captioning.model.paper import AdditiveScore, PreviousState, SoftAttention

# Where the backward computes the score's tanh(W_a a + W_h h) [n, L, A] again, step by step, rather than
# keep it for all N positions: on a GPU, where [N, L, A] is gigabytes at B = 512 and reading it back
# moves about the bytes that computing it again does. On a CPU the tanh is the dearer part of a step
# and memory is plentiful: it is kept.
RECOMPUTED_ON = frozenset({"cuda"})
# Where the score runs as Triton kernels (captioning.model.score_kernels) that never write tanh(.) at
# all, forward or backward: on a GPU, where Triton is installed (it comes with torch's Linux wheels).
KERNELS_ON = frozenset({"cuda"})


_kernels_ran: dict[str, bool] = {}  # per device type: whether the kernels compiled and ran here


def score_kernels(device_type: str):
    """captioning.model.score_kernels where it runs (KERNELS_ON, Triton importable, and the kernels
    compile and run on this machine's GPU: Triton needs compute capability 7.0 or later); None
    elsewhere, and the score is computed in PyTorch, its tanh again in the backward."""
    if device_type not in KERNELS_ON:
        return None
    try:
        from captioning.model import score_kernels as kernels
    except ImportError:  # no Triton
        return None
    if device_type not in _kernels_ran:
        try:  # one tiny launch of each, once a process: what fails here would fail mid-run
            v, d_e = torch.zeros(3, device=device_type), torch.zeros(1, 2, device=device_type)
            for dtype in (torch.float32, torch.bfloat16):  # keys and queries as a run hands them: each compiles apart
                keys = torch.zeros(1, 2, 3, device=device_type, dtype=dtype)
                rows = torch.zeros(1, 3, device=device_type, dtype=dtype)
                kernels.score(keys, rows, v)
                kernels.query_grad(keys, rows, v, d_e)
                kernels.keys_and_v_grads(keys, rows, d_e, v, [1])
            _kernels_ran[device_type] = True
        except Exception as error:  # noqa: BLE001 (a compiler's or a driver's: any of them means "not here")
            warnings.warn(f"model.fused: the additive score's Triton kernels do not run on this {device_type} "
                          f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); the fused "
                          "path computes the score in PyTorch", RuntimeWarning, stacklevel=2)
            _kernels_ran[device_type] = False
    return kernels if _kernels_ran[device_type] else None


def supports(decoder: torch.nn.Module) -> bool:
    """Whether `decoder` is exactly what this path implements: the paper's query h_{t-1}, and soft
    attention with the additive score at temperature 1 (the fused softmax has none). What attention
    sees of the annotations does not matter: `start` runs before the recurrence either way. This
    path asks, so that the decoder need not ask which seams it holds."""
    attention = decoder.attention
    return (type(decoder.query) is PreviousState and type(attention) is SoftAttention
            and type(attention.score) is AdditiveScore and attention.temperature == 1.0)


def recurrence(decoder: torch.nn.Module, memory, state, embedded: torch.Tensor,
               batch_sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decoder's teacher-forced recurrence over packed positions (AttentionDecoder.forward):
    memory and the initial state (h, c) [B, H] of rows sorted by length, embedded [N, E] packed, n_t
    in `batch_sizes` -> h [N, H], z [N, D], alpha [N, L].

    Under bf16 autocast the products and the score's [n, L, A] tensor run in bf16 and the cell state,
    the softmax and the gradients' sums over steps stay in the parameters' dtype (float32); under any
    other autocast (fp16, whose range a recurrence of 20 steps can leave) all of it runs in float32.
    The output layer after it runs in the autocast dtype either way."""
    dtype = decoder.lstm.weight_ih.dtype
    device = embedded.device.type
    low = (torch.bfloat16 if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16
           else dtype)
    with torch.autocast(device, enabled=False):
        gates_x = word_gates(decoder, embedded.to(dtype))  # [N, 4H], the word part for all steps at once
        embed_dim = embedded.shape[1]
        return FusedRecurrence.apply(
            memory.keys.to(low), memory.annotations.to(low), gates_x, state.h.to(dtype), state.c.to(dtype),
            hidden_weights(decoder), decoder.gate.bias, decoder.attention.score.v.weight.view(-1),
            decoder.lstm.weight_ih[:, embed_dim:], batch_sizes, torch.is_grad_enabled(), device in RECOMPUTED_ON,
            score_kernels(device))


def hidden_weights(decoder: torch.nn.Module) -> torch.Tensor:
    """[A + G + 4H, H]: the score's W_h, the gate's W_beta and the LSTM's W_hh, stacked."""
    return torch.cat([decoder.attention.score.query.weight, decoder.gate.weight, decoder.lstm.weight_hh], 0)


def word_gates(decoder: torch.nn.Module, embedded: torch.Tensor) -> torch.Tensor:
    """W_ih[:, :E] E y + b_ih + b_hh: the LSTM gates' word part. embedded [..., E] -> [..., 4H]."""
    lstm = decoder.lstm
    embed_dim = embedded.shape[-1]
    return F.linear(embedded, lstm.weight_ih[:, :embed_dim], lstm.bias_ih + lstm.bias_hh)


def _lstm_pointwise(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """LSTMCell's gate order i, f, g, o. gates [n, 4H], c [n, H] -> i, f, g, o, c', tanh(c'), h'."""
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c = torch.addcmul(f * c, i, g)  # c_t = f c_{t-1} + i g, Eq. 2
    tc = torch.tanh(c)
    return i, f, g, o, c, tc, o * tc  # h_t = o tanh(c_t), Eq. 3


def _times(a: torch.Tensor, b: torch.Tensor, *, into: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b in b's dtype (the compute dtype), returned in a's (the parameters'): `into + a @ b`
    where given. In one dtype it is one product (addmm); in bf16 the product's output is rounded to
    bf16 before it is widened, as autocast's products are."""
    if a.dtype == b.dtype:
        return a @ b if into is None else torch.addmm(into, a, b)
    product = (a.to(b.dtype) @ b).to(a.dtype)
    return product if into is None else into + product


class FusedRecurrence(torch.autograd.Function):
    """The teacher-forced recurrence over the running prefix of each step; outputs are packed.

    forward(keys [B, L, A], annotations [B, L, D] in the compute dtype (the parameters', or bf16),
            gates_x [N, 4H] (word part, packed like the outputs), h0, c0 [B, H], w_hidden [A+G+4H, H],
            gate_bias [G], v [A], w_z [4H, D] in the parameters' dtype, batch_sizes [n_t],
            keep: whether to keep what backward needs; pass torch.is_grad_enabled() — inside a
            Function, needs_input_grad is True for parameters even under no_grad;
            recompute: whether backward computes each step's tanh(W_a a + W_h h) again from the
            queries [N, A] instead of keeping it [N, L, A];
            kernels: captioning.model.score_kernels, to compute the score and its gradients without
            writing tanh(.) at all (the queries [N, A] are kept), or None)
      -> h [N, H], z [N, D] (beta_t * z_t), alpha [N, L] in the parameters' dtype; step t occupies
         rows offsets[t]:offsets[t]+n_t.

    In the compute dtype: the products, the score's tanh and its products with v, alpha and the
    annotations. In the parameters' dtype: h, c and the LSTM's gates, the softmax, beta, and every
    sum over steps of the backward (the keys' and the weights' gradients).
    """

    @staticmethod
    def forward(ctx, keys, annotations, gates_x, h0, c0, w_hidden, gate_bias, v, w_z, batch_sizes, keep, recompute,
                kernels=None):
        batch, cells, att = keys.shape
        dim, hid, width = annotations.shape[2], h0.shape[1], gate_bias.shape[0]
        if torch.is_autocast_enabled(keys.device.type):
            raise RuntimeError("FusedRecurrence chooses its own dtypes: call it with autocast disabled")
        low = keys.dtype
        total = sum(batch_sizes)
        saving = keep and any(ctx.needs_input_grad)  # nothing is kept for inference
        new = h0.new_empty
        hs, zs, alphas = new(total, hid), new(total, dim), new(total, cells)  # packed outputs
        contexts, betas, acts = new(total, dim), new(total, width), new(total, 4 * hid)  # saved for backward
        cs, tcs = new(total, hid), new(total, hid)
        keeping = saving and not recompute and kernels is None
        # tanh(W_a a + W_h h) per step, unless the kernels compute the score without it
        tanhs = None if kernels is not None else keys.new_empty(total if keeping else batch, cells, att)
        queries = keys.new_empty(total, att) if saving and not keeping else None
        w_low, v_low, w_z_low = w_hidden.to(low).t(), v.to(low), w_z.to(low).t()  # one cast per batch
        h, c, start = h0, c0, 0
        for n in batch_sizes:
            rows = slice(start, start + n)
            h, c = h[:n], c[:n]
            projected = _times(h, w_low)  # [n, A+G+4H], every product with h_{t-1} at once
            query, gate, recurrent = projected.split([att, width, 4 * hid], 1)
            query = query.to(low)
            if kernels is not None:
                scores = kernels.score(keys[:n], query, v)  # [n, L], Eq. 4 (additive score), float32
            else:
                t = tanhs[rows] if keeping else tanhs[:n]
                scores = torch.add(keys[:n], query[:, None, :], out=t).tanh_() @ v_low  # [n, L], Eq. 4
            alpha = torch.softmax(scores, dim=1, dtype=h.dtype)  # [n, L], Eq. 5
            context = torch.bmm(alpha.to(low)[:, None, :], annotations[:n]).squeeze(1).to(h.dtype)  # [n, D], Eq. 13
            beta = torch.sigmoid(gate + gate_bias)  # [n, G], Sec. 4.2.1
            z = beta * context  # [n, D]
            gates = _times(z, w_z_low, into=recurrent + gates_x[rows])  # [n, 4H], LSTM input [E y; z]
            i, f, g, o, c, tc, h = _lstm_pointwise(gates, c)
            hs[rows], zs[rows], alphas[rows] = h, z, alpha
            contexts[rows], betas[rows], cs[rows], tcs[rows] = context, beta, c, tc
            torch.cat([i, f, g, o], 1, out=acts[rows])
            if queries is not None:
                queries[rows] = query
            start += n
        if saving:
            ctx.save_for_backward(keys, annotations, h0, c0, w_hidden, v, w_z, hs, zs, alphas, contexts, betas,
                                  acts, cs, tcs, tanhs if keeping else queries)
            ctx.batch_sizes, ctx.recompute, ctx.kernels = list(batch_sizes), recompute, kernels
        return hs, zs, alphas

    @staticmethod
    @once_differentiable  # a first-order backward, written by hand; no double backward through it
    def backward(ctx, grad_h, grad_z, grad_alpha):
        (keys, annotations, h0, c0, w_hidden, v, w_z, hs, zs, alphas, contexts, betas, acts, cs, tcs,
         kept) = ctx.saved_tensors
        batch_sizes = ctx.batch_sizes
        batch = keys.shape[0]
        cells, att = keys.shape[1], keys.shape[2]
        hid, width = h0.shape[1], betas.shape[1]
        total = hs.shape[0]
        low = keys.dtype
        zeros = hs.new_zeros
        grad_h = grad_h if grad_h is not None else zeros(total, hid)
        grad_z = grad_z if grad_z is not None else zeros(total, zs.shape[1])
        grad_alpha = grad_alpha if grad_alpha is not None else zeros(total, cells)
        want_annotations = ctx.needs_input_grad[1]
        w_low, w_z_low = w_hidden.to(low), w_z.to(low)
        annotations_t = annotations.transpose(1, 2)  # [B, D, L]

        # d(projected) for every position: [d query; d gate; d gates], the rows of one final product.
        grad_projected = hs.new_empty(total, att + width + 4 * hid)
        unfused = ctx.kernels is None  # the score's [B, L, A] buffers, which the kernels do without
        weighted = zeros(batch, cells, att) if unfused else None  # sum_t de_t tanh^2: the keys' gradient without v
        grad_e_sum = zeros(batch, cells) if unfused else None  # sum_t de_t
        grad_v = zeros(att)
        d_es = None if unfused else zeros(total, cells)  # every step's d_e, for the keys' kernel after the loop
        grad_annotations = zeros(annotations.shape) if want_annotations else None
        squared = keys.new_empty(batch, cells, att) if unfused else None
        scratch = keys.new_empty(batch, cells, att) if unfused and ctx.recompute else None
        dh, dc = zeros(batch, hid), zeros(batch, hid)  # carried from step t+1; rows past their end stay 0
        offsets = [0]
        for n in batch_sizes[:-1]:
            offsets.append(offsets[-1] + n)
        for step in reversed(range(len(batch_sizes))):
            n, start = batch_sizes[step], offsets[step]
            rows = slice(start, start + n)
            c_prev = c0[:n] if step == 0 else cs[offsets[step - 1]: offsets[step - 1] + n]
            i, f, g, o = acts[rows].chunk(4, 1)
            tc, beta, context = tcs[rows], betas[rows], contexts[rows]
            dh_t = grad_h[rows] + dh[:n]
            dc_t = dc[:n] + dh_t * o * (1 - tc * tc)  # through h = o tanh(c)
            d_gates = torch.cat([dc_t * g * i * (1 - i), dc_t * c_prev * f * (1 - f), dc_t * i * (1 - g * g),
                                 dh_t * tc * o * (1 - o)], 1)  # [n, 4H], i, f, g, o pre-activations
            grad_projected[rows, att + width:] = d_gates
            dz = _times(d_gates, w_z_low, into=grad_z[rows])  # [n, D]
            d_beta = dz * context
            if width == 1:
                d_beta = d_beta.sum(1, keepdim=True)
            grad_projected[rows, att:att + width] = d_beta * beta * (1 - beta)
            d_context = dz * beta  # [n, D]
            alpha = alphas[rows]
            if want_annotations:
                grad_annotations[:n].baddbmm_(alpha[:, :, None], d_context[:, None, :])
            # [n, 1, D] x [n, D, L] rather than [n, L, D] x [n, D, 1]: the same numbers, but MKL's batched
            # product runs this orientation several times faster on the CPU we measured (docs/benchmarks.md).
            d_alpha = torch.bmm(d_context.to(low)[:, None, :], annotations_t[:n]).squeeze(1)  # [n, L]
            d_alpha = grad_alpha[rows] + d_alpha
            d_e = alpha * (d_alpha - (d_alpha * alpha).sum(1, keepdim=True))  # softmax backward
            if ctx.kernels is not None:  # the query's gradient now, the keys' and v's after the loop
                grad_projected[rows, :att] = ctx.kernels.query_grad(keys[:n], kept[rows], v, d_e)
                d_es[rows] = d_e
            else:
                # [n, L, A]: tanh(W_a a + W_h h_{t-1}) again, from this step's query, or as kept
                t = (torch.add(keys[:n], kept[rows][:, None, :], out=scratch[:n]).tanh_() if ctx.recompute
                     else kept[rows])
                d_e_low = d_e.to(low)
                grad_v += (t.reshape(-1, att).t() @ d_e_low.reshape(-1)).to(grad_v.dtype)  # e = tanh(.) v
                t2 = torch.mul(t, t, out=squared[:n])
                # d pre = v * d_e * (1 - tanh^2): summed over cells for the query, accumulated for the keys.
                d_query = v * (d_e.sum(1, keepdim=True) - torch.bmm(d_e_low[:, None, :], t2).squeeze(1).to(v.dtype))
                grad_projected[rows, :att] = d_query  # [n, A]
                weighted[:n].addcmul_(t2, d_e[:, :, None])
                grad_e_sum[:n] += d_e
            dh[:n] = _times(grad_projected[rows], w_low)  # [n, H], every path back to h_{t-1} at once
            dc[:n] = dc_t * f
        h_prev = torch.cat([h0[:batch_sizes[0]]] + [hs[offsets[s - 1]: offsets[s - 1] + batch_sizes[s]]
                                                    for s in range(1, len(batch_sizes))])  # [N, H]
        grad_w_hidden = _times(grad_projected.t(), h_prev.to(low))  # [A+G+4H, H], one product over all positions
        grad_gate_bias = grad_projected[:, att:att + width].sum(0)
        grad_w_z = _times(grad_projected[:, att + width:].t(), zs.to(low))  # [4H, D]
        if ctx.kernels is not None:  # sum_t v * d_e_t * (1 - tanh_t^2), and v's, the keys read once
            grad_keys, grad_v = ctx.kernels.keys_and_v_grads(keys, kept, d_es, v, batch_sizes)
            grad_v = grad_v.to(v.dtype)
        else:
            grad_keys = (grad_e_sum[:, :, None] - weighted).mul_(v).to(low)  # sum_t v * d_e_t * (1 - tanh_t^2)
        grad_gates_x = grad_projected[:, att + width:]  # the word part enters the gates as is
        if grad_annotations is not None:
            grad_annotations = grad_annotations.to(low)
        return (grad_keys, grad_annotations, grad_gates_x, dh, dc, grad_w_hidden, grad_gate_bias, grad_v, grad_w_z,
                None, None, None, None)


class GroupedStep:
    """`AttentionDecoder.next_word` for K hypotheses per image that share the image's memory (no gradient).

    Beam search continues K hypotheses of each image. The keys W_a a_i [B, L, A] and annotations
    [B, L, D] are the image's, so they are broadcast to the K hypotheses instead of copied K times:
    the context product reads each image's annotations once per step, not K times.
    """

    def __init__(self, decoder: torch.nn.Module, *, keys: torch.Tensor, annotations: torch.Tensor, group: int):
        self.decoder, self.keys, self.annotations, self.group = decoder, keys, annotations, group  # [B, L, *]
        self.w_hidden = hidden_weights(decoder)  # [A+G+4H, H], stacked once per search
        self.widths = [keys.shape[2], decoder.gate.weight.shape[0], decoder.lstm.weight_hh.shape[0]]
        self.scratch: torch.Tensor | None = None  # [B, K, L, A], tanh(W_a a_i + W_h h) of every hypothesis
        self.kernels = score_kernels(keys.device.type)  # on a GPU: the score without the scratch

    @torch.no_grad()
    def __call__(self, h: torch.Tensor, c: torch.Tensor,
                 tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """h, c [B*K, H] (image-major rows), previous tokens [B*K] -> logits [B*K, V], h, c, alpha [B*K, L]."""
        d = self.decoder
        batch, cells, att = self.keys.shape
        embedded = d.embed(tokens)  # [BK, E]
        query, gate, recurrent = (h @ self.w_hidden.t()).split(self.widths, 1)
        v = d.attention.score.v.weight.view(-1)
        if self.kernels is not None:  # [B, K, L], Eq. 4, each image's keys read once for its K rows
            scores = self.kernels.score(self.keys, query, v, group=self.group).view(batch, self.group, cells)
        else:
            if self.scratch is None or self.scratch.dtype != query.dtype:
                # One buffer for every step: a fresh [B, K, L, A] tensor each step costs page faults on a CPU.
                self.scratch = query.new_empty(batch, self.group, cells, att)
            t = torch.add(self.keys[:, None], query.view(batch, self.group, 1, att), out=self.scratch).tanh_()  # Eq. 4
            scores = t @ v  # [B, K, L]
        alpha = torch.softmax(scores, dim=2)  # [B, K, L], Eq. 5
        context = torch.bmm(alpha, self.annotations).view(batch * self.group, -1)  # [BK, D], Eq. 13
        z = torch.sigmoid(gate + d.gate.bias) * context  # beta_t * z_t, Sec. 4.2.1
        gates = torch.addmm(recurrent + word_gates(d, embedded), z, d.lstm.weight_ih[:, embedded.shape[1]:].t())
        *_, c, _, h = _lstm_pointwise(gates, c)
        return d.word_logits(embedded, h, z), h, c, alpha.view(batch * self.group, cells)
