"""The fast path checks itself against the step-by-step decoder, once per decoder and process.

captioning.model.fused writes the paper's step (Eqs. 1-6, Sec. 4.2.1) a second time, for speed. An
edit to the step-by-step modules (the additive score's tanh, the gate, the LSTM) that the fast path
does not copy would leave a default run computing the old equations without a word. So the first
time a decoder takes the fast path, both paths run on a tiny batch with the decoder's own weights:
the teacher-forced recurrence (values, and the gradients of the weights and inputs) and the grouped
decoding step (values). Where they disagree, FastPathError says what differs, and by how much,
and the way out (model.fused=false). It costs milliseconds.

Notation: B images, K rows per image, L cells, D annotation channels, E embedding, T steps.
"""

from __future__ import annotations

import weakref

import torch

from captioning.model import fused
from captioning.model.packing import stepwise_recurrence
from captioning.runtime.precision import full_float32

# Float32 on both sides, TF32 off (a GPU's TF32 matmuls alone differ by ~1e-3 between the paths):
# the two paths order their sums differently, by ~1e-6 of the values.
TOLERANCE = 1e-4

_proven: dict[str, weakref.WeakSet] = {"recurrence": weakref.WeakSet(), "grouped": weakref.WeakSet()}


class FastPathError(RuntimeError):
    """The fast path and the step-by-step decoder compute different things; the message says what."""


def _tiny_batch(decoder: torch.nn.Module, like: torch.Tensor, *,
                images: int) -> tuple[torch.Tensor, torch.Generator]:
    """Random annotations [images, L, D] shaped as the real batch `like` [B, L, D] (a decoder built
    for a grid takes no other L), in the decoder's dtype, and the generator that drew them."""
    generator = torch.Generator().manual_seed(0)
    annotations = torch.randn(images, *like.shape[1:], generator=generator, device="cpu")
    return annotations.to(like.device, decoder.lstm.weight_ih.dtype), generator


def _unchecked(decoder: torch.nn.Module, kind: str, like: torch.Tensor) -> bool:
    """Whether there is something to check: a decoder the fast path computes, not checked yet, on
    values (a meta tensor, for shape checks, holds none)."""
    return decoder not in _proven[kind] and like.device.type != "meta" and fused.supports(decoder)


def _compare(pairs: list[tuple[str, torch.Tensor | None, torch.Tensor | None]]) -> None:
    """Raise FastPathError at the first pair (what, fast, slow) that differs beyond the tolerance.
    One read from the device for all of them."""
    for what, fast, slow in pairs:
        if (fast is None) != (slow is None):
            raise FastPathError(f"model.fused: the fast path (captioning/model/fused.py) and the step-by-step "
                                f"decoder differ on whether there is {what}; set model.fused=false to run step by "
                                "step")
    pairs = [(what, fast, slow) for what, fast, slow in pairs if fast is not None]
    measured = torch.stack([torch.stack([(fast.float() - slow.float()).abs().max(), slow.float().abs().max()])
                            for _, fast, slow in pairs]).tolist()  # [pairs, 2]: difference, scale
    for (what, _, _), (difference, largest) in zip(pairs, measured):
        tolerance = TOLERANCE * (1.0 + largest)
        if not difference <= tolerance:  # also catches a NaN
            raise FastPathError(
                f"model.fused: the fast path (captioning/model/fused.py) and the step-by-step decoder disagree on "
                f"{what} by {difference:.3g} (tolerance {tolerance:.1g}): they no longer compute the same "
                "equations; set model.fused=false to train and decode step by step, or make the two agree")


# A compiled decoder checks itself as it is, outside the graph. The decorator imports torch._dynamo
# (about a second), but so do timm, torchvision.models and any optimizer's constructor: a lazy form
# of it would take that second off no command.
@torch.compiler.disable
def prove_recurrence(decoder: torch.nn.Module, like: torch.Tensor) -> None:
    """Check `fused.recurrence` against the decoder's step-by-step recurrence, once per decoder, on a
    batch shaped as `like` [B, L, D] (the annotations of its first batch)."""
    if not _unchecked(decoder, "recurrence", like):
        return
    annotations, generator = _tiny_batch(decoder, like, images=3)
    batch_sizes = [3, 2, 1]  # rows sorted by length: 3 running, then 2, then 1
    device = annotations.device
    embedded = torch.randn(sum(batch_sizes), decoder.embed.embedding_dim,
                           generator=generator, device="cpu").to(device, annotations.dtype)  # [N, E]
    weights = [p for p in decoder.parameters() if p.requires_grad]
    was_training = decoder.training
    decoder.eval()  # nothing random in the recurrence either way; dropout acts on the output layer only
    try:
        with torch.enable_grad(), torch.autocast(device.type, enabled=False), full_float32():
            outputs = {}
            for name in ("fast", "slow"):
                inputs = [annotations.clone().requires_grad_(), embedded.clone().requires_grad_()]
                memory, state = decoder.start(inputs[0])
                if name == "fast":
                    h, z, alpha = fused.recurrence(decoder, memory, state, inputs[1], batch_sizes)
                else:
                    h, z, alpha, _ = stepwise_recurrence(decoder, memory, state, inputs[1], batch_sizes)
                # a fixed random direction through all three outputs, so every gradient is exercised
                direction = torch.Generator().manual_seed(1)
                total = sum((torch.randn(out.shape, generator=direction, device="cpu").to(device, out.dtype)
                             * out).sum()
                            for out in (h, z, alpha))
                grads = torch.autograd.grad(total, [*inputs, *weights], allow_unused=True)
                outputs[name] = (h.detach(), z.detach(), alpha.detach(), grads)
    finally:
        decoder.train(was_training)
    fast, slow = outputs["fast"], outputs["slow"]
    names = ["the annotations", "the word embeddings", *(name for name, p in decoder.named_parameters()
                                                         if p.requires_grad)]
    _compare([*((f"{what} (teacher forcing)", a, b) for what, a, b in zip(("h_t", "z_t", "alpha_t"), fast, slow)),
              *((f"the gradient of {name}", a, b) for name, a, b in zip(names, fast[3], slow[3]))])
    _proven["recurrence"].add(decoder)


@torch.compiler.disable
@torch.no_grad()
def prove_grouped_step(decoder: torch.nn.Module, like: torch.Tensor) -> None:
    """Check `fused.GroupedStep` (greedy and beam search) against `decoder.next_word`, once per decoder, on a
    batch shaped as `like` [B, L, D]."""
    if not _unchecked(decoder, "grouped", like):
        return
    annotations, generator = _tiny_batch(decoder, like, images=2)
    group, device = 2, annotations.device
    rows = torch.arange(2, device=device).repeat_interleave(group)  # [B*K]
    tokens = torch.randint(decoder.embed.num_embeddings, (rows.shape[0],), generator=generator,
                           device="cpu").to(device)
    was_training = decoder.training
    decoder.eval()
    try:
        with torch.autocast(device.type, enabled=False), full_float32():
            memory, state = decoder.start(annotations)
            state = state.select(rows)
            grouped = fused.GroupedStep(decoder, keys=memory.keys, annotations=memory.annotations, group=group)
            fast = grouped(state.h, state.c, tokens)
            logits, after, attended = decoder.next_word(memory.select(rows), state, tokens)
            slow = (logits, after.h, after.c, attended.alpha)
    finally:
        decoder.train(was_training)
    _compare([(f"{what} (one decoding step)", a, b) for what, a, b in zip(("logits", "h_t", "c_t", "alpha_t"),
                                                                           fast, slow)])
    _proven["grouped"].add(decoder)
