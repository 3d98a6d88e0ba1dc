"""Gradient variance of hard attention's REINFORCE estimator with each baseline, on a toy problem
small enough to know the exact gradient (the one tests/train/test_reinforce.py checks for bias).

    python -m studies.reinforce_variance.run            # prints a markdown table

Toy: one image of 3 cells and two captions of it, of 2 and 5 words + <end> (3 and 6 steps: 27 and
729 location sequences), so that their rewards log p(y|s,a) differ a lot, as captions of a real
batch do; the real AttentionDecoder (H=16, additive score, no dropout); hard attention that always
samples. For each estimator we draw R batches of 64 sampled captions (half of each caption; with K
samples per caption, in blocks of K), compute the gradient exactly as train_step does, and report
the total variance (sum over parameter entries of the variance across batches) of the gradient of
the attention parameters and of all parameters, and the relative error of the mean over all batches
against the exact gradient of the bound (the mean over the two captions of sum_s p(s|a) log p(y|s,a)).
"""

from __future__ import annotations

import itertools

import torch

from captioning.data.vocab import Vocabulary
from captioning.model.paper import (
    AdditiveScore,
    AttentionDecoder,
    HardAttention,
    Reinforce,
    caption_log_likelihood,
    cross_entropy,
)
from tests.given_locations import GivenLocations

GRID, D, H, A, V = (1, 3), 8, 16, 8, 11
L = GRID[0] * GRID[1]
BATCH, REPEATS = 64, 400


def decoder(sequences: torch.Tensor | None = None) -> AttentionDecoder:
    torch.manual_seed(0)
    attention = HardAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=A), expectation_prob=0.0)
    if sequences is not None:
        attention = GivenLocations(attention.score, sequences)
    return AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                            dropout=0.0).train()


ANNOTATIONS = 2 * torch.randn(1, L, D, generator=torch.Generator().manual_seed(7))
S, E, P = Vocabulary.start_id, Vocabulary.end_id, Vocabulary.pad_id
CAPTIONS = torch.tensor([[S, 5, 8, E, P, P, P], [S, 4, 6, 7, 9, 10, E]])  # 3 and 6 steps
STEPS = CAPTIONS.shape[1] - 1


def exact() -> tuple[torch.Tensor, list[float]]:
    """The exact gradient of the mean bound over the two captions, and each caption's E_s[log p(y|s,a)]."""
    total, rewards = None, []
    for caption in CAPTIONS:
        steps = int((caption != P).sum()) - 1
        sequences = torch.tensor(list(itertools.product(range(L), repeat=steps)))
        model = decoder(sequences)
        n = len(sequences)
        output = model(ANNOTATIONS.expand(n, L, D), caption[None, :steps].expand(n, steps))
        log_p_y = caption_log_likelihood(output.logits, caption[None, 1: steps + 1].expand(n, steps),
                                         torch.ones(n, steps))
        bound = (output.log_probs.sum(1).exp() * log_p_y).sum() / len(CAPTIONS)
        grads = torch.cat([g.flatten() for g in torch.autograd.grad(bound, list(model.parameters()))])
        total = grads if total is None else total + grads
        rewards.append(float(bound.detach()) * len(CAPTIONS))
    return total, rewards


def estimates(reinforce: Reinforce) -> torch.Tensor:
    """REPEATS gradient estimates [REPEATS, P], each from one batch of BATCH sampled captions."""
    model = decoder()
    torch.manual_seed(1)
    which = (torch.arange(BATCH) // reinforce.location_samples) % len(CAPTIONS)  # [BATCH], blocks of K replicas
    tokens = CAPTIONS[which]  # [BATCH, T]
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mask = (targets != P).float()
    rows = []
    for _ in range(REPEATS):
        output = model(ANNOTATIONS.expand(BATCH, L, D), inputs)
        surrogate, _ = reinforce(logits=output.logits, targets=targets, mask=mask, log_probs=output.log_probs,
                                 entropies=output.entropies, locations=output.locations)
        loss = cross_entropy(output.logits, targets, mask) + surrogate
        grads = torch.autograd.grad(loss, list(model.parameters()))
        # loss = -(1/sum m) sum_n [...]: times -sum m / N, the mean per-caption estimate of d L_s
        rows.append(-float(mask.sum()) / BATCH * torch.cat([g.flatten() for g in grads]))
    return torch.stack(rows)


def main() -> int:
    torch.set_num_threads(1)
    gradient, expected_rewards = exact()
    sizes = [p.numel() for p in decoder().parameters()]
    names = [n for n, _ in decoder().named_parameters()]
    attention = torch.cat([torch.full((s,), n.startswith("attention."), dtype=torch.bool)
                           for n, s in zip(names, sizes)])
    print(f"toy: {L} cells, two captions with E_s[log p(y|s,a)] = "
          f"{', '.join(f'{r:.2f}' for r in expected_rewards)}; "
          f"{REPEATS} batches of {BATCH} sampled captions per estimator\n")
    print("| estimator | variance, attention params | variance, all params | relative error of the mean |")
    print("|---|---|---|---|")
    estimators = {
        "no baseline (b = 0)": Reinforce(baseline="none"),
        "moving average (paper; 0.9/0.1)": Reinforce(baseline="moving_average"),
        "leave-one-out, 4 samples per caption": Reinforce(baseline="leave_one_out", location_samples=4),
        "leave-one-out, 8 samples per caption": Reinforce(baseline="leave_one_out", location_samples=8),
    }
    for name, reinforce in estimators.items():
        draws = estimates(reinforce)  # [R, P]
        variance = draws.var(0)  # [P]
        error = (draws.mean(0) - gradient).norm() / gradient.norm()
        print(f"| {name} | {float(variance[attention].sum()):.4g} | {float(variance.sum()):.4g} | {float(error):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
