"""Host syncs per training step, counted (tests/syncs.py) and held to the few that are needed.

On a GPU the host queues kernels ahead of the device; each read of a device value on the host
(`.item()`, `bool(tensor)`, `.tolist()`, a boolean mask) makes it wait until the device is idle. The
bounds below are what remains; each is listed with why it cannot go:

  1. AttentionDecoder.forward: n_t, the rows still running at each step, are the Python loop's sizes
     (the recurrence runs on the running prefix of each step). The lengths' check and whether the
     rows are sorted already come back in the same trip.
  2. train_step: the losses and the gradient norm for the log, with the finiteness check that decides
     whether the optimizer steps, in one trip.
  3. Reinforce (hard attention only): the moving-average baseline is a Python float kept in
     checkpoints; its update comes back with the REINFORCE statistics in one trip.

Before they were counted, a step made 10 (soft) and 19 (hard; 22 on the first step, which also
read the first batch's mean reward for the baseline).
"""

from __future__ import annotations

import pytest
import torch

from captioning.config import load_config
from captioning.data.dataset import Batch
from captioning.data.vocab import Vocabulary
from captioning.model.encoder_decoder import EncoderDecoder, build_decoder
from captioning.train.losses import Reinforce
from captioning.train.step import train_step
from tests.syncs import counting_syncs

V, L, D = 11, 9, 8
BOUNDS = {"soft": 2, "hard": 3}  # the trips listed in the module docstring


def _batch(seed: int) -> Batch:
    """Three captions of different lengths, not sorted longest first, with padding."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [5, 7, 4]
    tokens = torch.full((3, max(lengths)), Vocabulary.pad_id, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(4, V, (n,), generator=generator)
        tokens[row, 0], tokens[row, n - 1] = Vocabulary.start_id, Vocabulary.end_id
    return Batch(annotations=torch.randn(3, L, D, generator=generator), tokens=tokens, lengths=torch.tensor(lengths))


def _setup(attention: str, score: str, samples: int) -> tuple[torch.nn.Module, Reinforce | None]:
    torch.manual_seed(0)
    config = load_config(None, [f"model.attention={attention}", f"model.score={score}", "model.embed_dim=8",
                                "model.hidden_dim=16", "model.attention_dim=8"])
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=(3, 3))
    if attention == "soft":
        return decoder, None
    baseline = "leave_one_out" if samples > 1 else "moving_average"
    reinforce = Reinforce(baseline=baseline, samples=samples, entropy_weight=0.01)
    return EncoderDecoder(encoder=None, decoder=decoder), reinforce


@pytest.mark.parametrize("attention, score, samples", [
    ("soft", "additive", 1),  # the paper's default: the fused recurrence
    ("soft", "dot", 1),  # any other score: the step-by-step recurrence
    ("hard", "additive", 1),  # REINFORCE with the paper's moving average
    ("hard", "additive", 2),  # two samples per caption, the leave-one-out baseline
])
def test_a_training_step_reads_the_device_only_a_few_times(attention, score, samples):
    model, reinforce = _setup(attention, score, samples)
    # SGD: Adam keeps its step counts on the host (its .item() there waits for nothing), fused Adam on
    # the device; either way that is the optimizer's business, not the step's.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):  # the first REINFORCE step starts the baseline from the batch's mean reward
        batch = _batch(step)
        with counting_syncs() as syncs:
            losses = train_step(model, batch, optimizer, grad_clip=5.0, ds_lambda=1.0,
                                reinforce=reinforce, step=step)
        where = ", ".join(f"{kind} at {line}" for (kind, line), n in sorted(syncs.sites.items()) for _ in range(n))
        assert syncs.total <= BOUNDS[attention], f"step {step}: {syncs.total} host syncs: {where}"
        assert not losses.skipped and all(isinstance(value, float) for value in losses.losses.values())


@pytest.mark.parametrize("attention, beam_size, scored", [("soft", 1, True), ("hard", 1, False), ("soft", 3, False)])
def test_a_validation_batch_reads_the_device_once_per_word_and_once_for_its_captions(attention, beam_size, scored):
    """Decoding a batch (validation, evaluation) reads the device:
      - once per decoded word: whether every caption has ended, so that decoding stops there (a
        batch's captions end long before decode.max_length; the check costs less than the steps);
      - once for the batch's tokens, and once more for its maps where a scorer reads them (the
        shapes data), instead of once per image as before.
    The cache's fp16 rows are widened after they move to the device (not counted: a copy to it)."""
    from captioning.eval.evaluate import decode_split
    from captioning.eval.shapes.scorer import ShapesScorer

    model, _ = _setup(attention, "additive", 1)
    decoder = getattr(model, "decoder", model).eval()
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", *(f"w{i}" for i in range(V - 4))])
    images, batch_size, max_length = 10, 5, 12
    annotations = torch.randn(images, L, D, generator=torch.Generator().manual_seed(0)).half().numpy()

    class Scorer(ShapesScorer):  # what a scorer reads: the words and maps of each caption
        def __init__(self):
            self.maps = []

        def caption(self, index, words, alphas):
            self.maps.append(alphas)

        def images(self, decoder, annotations, start):
            pass

    with counting_syncs() as syncs:
        decoded = decode_split(decoder, annotations, image_ids=list(range(images)), vocab=vocab, grid=(3, 3),
                               scorer=Scorer() if scored else None, beam_size=beam_size, max_length=max_length,
                               batch_size=batch_size, device=torch.device("cpu"))
    batches = images // batch_size
    words = syncs.counts["__bool__"]  # the per-word "has every caption ended?"
    assert len(decoded.results) == images and 0 < words <= batches * max_length
    assert syncs.total - words == batches * (2 if scored else 1), dict(syncs.sites)
