"""The parameter update of one training step is the gradient of the documented objective.

The reference is written here from the paper (Eq. 14, Sec. 4.1) with plain torch ops on the decoder's
own outputs: word cross-entropy + lambda * doubly stochastic term + (hard attention) the REINFORCE
surrogate. SGD with lr=1, no momentum and no effective clipping makes the update equal the gradient.
"""

from __future__ import annotations

import copy

import pytest
import torch

from captioning.data.dataset import Batch
from captioning.data.vocab import Vocabulary
from captioning.model.attention import HardAttention, SoftAttention, set_training_step
from captioning.model.decoder import AttentionDecoder
from captioning.model.scores import AdditiveScore
from captioning.train.losses import Reinforce
from captioning.train.step import train_step

B, L, D, H, V = 4, 9, 8, 16, 12
PAD, START, END = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id
DS_WEIGHT = 2.0  # not 1, so that a missing weight shows
REINFORCE_WEIGHT, ENTROPY_WEIGHT = 0.7, 0.3


def make_decoder(kind: str) -> AttentionDecoder:
    torch.manual_seed(0)
    score = AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=8)
    attention = SoftAttention(score) if kind == "soft" else HardAttention(score, expectation_prob=0.5)
    return AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                            dropout=0.0)


def make_batch() -> Batch:
    annotations = torch.randn(B, L, D, generator=torch.Generator().manual_seed(3))
    tokens = torch.tensor([[START, 4, 5, 6, 7, 8, END],  # different lengths: padding and row sorting
                           [START, 9, 10, END, PAD, PAD, PAD],
                           [START, 11, 4, 4, END, PAD, PAD],
                           [START, 6, END, PAD, PAD, PAD, PAD]])
    return Batch(annotations=annotations, tokens=tokens, lengths=(tokens != PAD).sum(1))


def objective_by_hand(decoder: AttentionDecoder, batch: Batch, *, hard: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                         torch.Tensor]:
    """(objective, its doubly stochastic part, the locations) from the decoder's outputs."""
    inputs, targets = batch.tokens[:, :-1], batch.tokens[:, 1:]
    mask = (targets != PAD).float()  # [B, T]
    decoder.train()
    set_training_step(decoder, 0)
    out = decoder(batch.annotations, inputs, lengths=mask.sum(1).long())
    word_log_probs = torch.log_softmax(out.logits, dim=2).gather(2, targets[:, :, None])[:, :, 0]  # [B, T]
    words = mask.sum()
    xe = -(word_log_probs * mask).sum() / words
    # Eq. 14 with tau = 1: sum over cells of (1 - sum over real steps of alpha)^2, mean over images
    coverage = (out.alphas * mask[:, :, None]).sum(1)  # [B, L]
    ds = ((1.0 - coverage) ** 2).sum(1).mean()
    objective = xe + DS_WEIGHT * ds
    if hard:
        # Sec. 4.1: reward log p(y|s,a), baseline = the first batch's mean reward over sampled captions
        sampled = (out.locations >= 0).any(1).float()  # [B]
        reward = (word_log_probs * mask).sum(1).detach()  # [B]
        baseline = (reward * sampled).sum() / sampled.sum()
        score_function = ((reward - baseline) * sampled * (out.log_probs * mask).sum(1)).sum()
        entropy = (sampled * (out.entropies * mask).sum(1)).sum()
        objective = objective - (REINFORCE_WEIGHT * score_function + ENTROPY_WEIGHT * entropy) / words
    return objective, DS_WEIGHT * ds, out.locations


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_one_step_moves_the_weights_by_the_gradient_of_the_documented_objective(kind: str) -> None:
    hard = kind == "hard"
    decoder, batch = make_decoder(kind), make_batch()
    reference = copy.deepcopy(decoder)
    before = {name: p.detach().clone() for name, p in decoder.named_parameters()}

    torch.manual_seed(11)  # the same coins and samples in both: the seed is reset before each forward
    optimizer = torch.optim.SGD(decoder.parameters(), lr=1.0)
    reinforce = Reinforce(weight=REINFORCE_WEIGHT, entropy_weight=ENTROPY_WEIGHT) if hard else None
    result = train_step(decoder, batch, optimizer, grad_clip=1e9, ds_weight=DS_WEIGHT, ds_target="one",
                        reinforce=reinforce)

    torch.manual_seed(11)
    objective, ds_part, locations = objective_by_hand(reference, batch, hard=hard)
    names = [name for name, _ in reference.named_parameters()]
    gradients = torch.autograd.grad(objective, list(reference.parameters()), retain_graph=True, allow_unused=True)
    ds_gradients = torch.autograd.grad(ds_part, list(reference.parameters()), allow_unused=True)

    if hard:  # the case is only a test of the sampled-rows mask if the coin went both ways
        sampled = (locations >= 0).any(1)
        assert 0 < int(sampled.sum()) < B, locations
    assert result["loss"] == pytest.approx(float(objective.detach()), rel=1e-5)
    moved = 0.0
    for name, gradient, ds_gradient in zip(names, gradients, ds_gradients):
        param = dict(decoder.named_parameters())[name]
        update = before[name] - param.detach()
        expected = torch.zeros_like(update) if gradient is None else gradient
        torch.testing.assert_close(update, expected, rtol=1e-4, atol=1e-6, msg=name)
        if ds_gradient is not None:
            moved = max(moved, float(ds_gradient.abs().max()))
    assert moved > 1e-2  # the doubly stochastic term moves the weights far beyond the tolerance
