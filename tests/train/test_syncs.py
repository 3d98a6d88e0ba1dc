"""Host syncs per training step, counted (tests/syncs.py) and held to the few that are needed.

On a GPU the host queues kernels ahead of the device; each read of a device value on the host
(`.item()`, `bool(tensor)`, `.tolist()`, a boolean mask) makes it wait until the device is idle. A
step must read it a fixed number of times, whatever its captions' lengths and its batch's size (a
read per word or per caption would stall the device at every one); the reads that remain are the
trips below (TRIPS), each listed with why it cannot go:

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
from captioning.model import fused_check
from captioning.model.encoder_decoder import EncoderDecoder, build_decoder
from captioning.model.paper import Reinforce
from captioning.train.paper_objective import train_step
from tests.syncs import counting_syncs

V, L, D = 11, 9, 8
# The trips of the module docstring, by attention: a step makes at most one read for each.
TRIPS = {
    "soft": ("the decoder's running rows per step (with the lengths' check and order)",
             "train_step's losses, gradient norm and finiteness check"),
}
TRIPS["hard"] = (*TRIPS["soft"], "Reinforce's baseline update with its statistics")
# Batches of different caption lengths and sizes, not sorted longest first, with padding.
SHAPES = ([5, 7, 4], [3, 2, 3], [12, 9, 14], [5, 7, 4, 6, 3, 8, 2, 9])


def _batch(seed: int, lengths: list[int] = SHAPES[0]) -> Batch:
    """Captions of these lengths (<start> and <end> counted), padded to the longest."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths)), Vocabulary.pad_id, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(4, V, (n,), generator=generator)
        tokens[row, 0], tokens[row, n - 1] = Vocabulary.start_id, Vocabulary.end_id
    return Batch(annotations=torch.randn(len(lengths), L, D, generator=generator), tokens=tokens,
                 lengths=torch.tensor(lengths))


def _setup(attention: str, score: str, samples: int) -> tuple[torch.nn.Module, Reinforce | None]:
    torch.manual_seed(0)
    config = load_config(None, [f"model.attention={attention}", f"model.score={score}", "model.embed_dim=8",
                                "model.hidden_dim=16", "model.attention_dim=8"])
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=(3, 3))
    like = torch.zeros(1, 9, D)  # the fast path's one-time self-check, done here: it is not a step's work
    fused_check.prove_recurrence(decoder, like)
    fused_check.prove_grouped_step(decoder, like)
    if attention == "soft":
        return decoder, None
    baseline = "leave_one_out" if samples > 1 else "moving_average"
    reinforce = Reinforce(baseline=baseline, location_samples=samples, entropy_weight=0.01)
    return EncoderDecoder(encoder=None, decoder=decoder), reinforce


@pytest.mark.parametrize("attention, score, samples", [
    ("soft", "additive", 1),  # the paper's default: the fused recurrence
    ("soft", "dot", 1),  # any other score: the step-by-step recurrence
    ("hard", "additive", 1),  # REINFORCE with the paper's moving average
    ("hard", "additive", 2),  # two samples per caption, the leave-one-out baseline
])
def test_a_training_step_reads_the_device_as_often_whatever_its_captions(attention, score, samples):
    model, reinforce = _setup(attention, score, samples)
    # SGD: Adam keeps its step counts on the host (its .item() there waits for nothing), fused Adam on
    # the device; either way that is the optimizer's business, not the step's.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reads = []
    # the first REINFORCE step starts the baseline from the batch's mean reward: it is counted too
    for step, lengths in enumerate(SHAPES):
        with counting_syncs() as syncs:
            losses = train_step(model, _batch(step, lengths), optimizer, grad_clip=5.0, ds_lambda=1.0,
                                reinforce=reinforce, step=step)
        where = ", ".join(f"{kind} at {line}" for (kind, line), n in sorted(syncs.sites.items()) for _ in range(n))
        reads.append(syncs.total)
        assert syncs.total <= len(TRIPS[attention]), f"lengths {lengths}: {syncs.total} host syncs: {where}"
        assert not losses.skipped and all(isinstance(value, float) for value in losses.losses.values())
    assert len(set(reads)) == 1, f"host syncs by batch {SHAPES}: {reads}"  # none per word or per caption


@pytest.mark.parametrize("attention, beam_size, scored", [("soft", 1, True), ("hard", 1, False), ("soft", 3, False)])
def test_a_validation_batch_reads_the_device_once_per_word_and_once_for_its_captions(attention, beam_size, scored):
    """Decoding a batch (validation, evaluation) reads the device:
      - once per decoded word: whether every caption has ended, so that decoding stops there (a
        batch's captions end long before decode.max_length; the check costs less than the steps);
      - for the batch as a whole, whatever its images and beams: once for its tokens, and once more
        for its maps where a scorer reads them (the shapes data), instead of once per image as before.
    So the same images decoded in two batches instead of one read the device twice as often outside
    the steps. The cache's fp16 rows are widened after they move to the device (not counted: a copy to it)."""
    from captioning.eval.evaluate import decode_split
    from captioning.eval.shapes.scorer import ShapesScorer

    model, _ = _setup(attention, "additive", 1)
    decoder = getattr(model, "decoder", model).eval()
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", *(f"w{i}" for i in range(V - 4))])
    images, max_length = 10, 12
    annotations = torch.randn(images, L, D, generator=torch.Generator().manual_seed(0)).half().numpy()
    trips = ("the batch's tokens", *(("the batch's maps, for the scorer",) if scored else ()))

    class Scorer(ShapesScorer):  # what a scorer reads: the words and maps of each caption
        def __init__(self):
            self.maps = []

        def caption(self, index, words, alphas):
            self.maps.append(alphas)

        def images(self, decoder, annotations, start):
            pass

    outside = {}
    for batch_size in (5, 10):
        with counting_syncs() as syncs:
            decoded = decode_split(decoder, annotations, image_ids=list(range(images)), vocab=vocab, grid=(3, 3),
                                   scorer=Scorer() if scored else None, beam_size=beam_size,
                                   max_length=max_length, batch_size=batch_size, device=torch.device("cpu"))
        batches = images // batch_size
        words = syncs.counts["__bool__"]  # the per-word "has every caption ended?"
        assert len(decoded.results) == images and 0 < words <= batches * max_length
        outside[batches] = syncs.total - words
        assert outside[batches] <= batches * len(trips), dict(syncs.sites)
    assert outside[2] == 2 * outside[1]  # per batch, not per image or per beam
