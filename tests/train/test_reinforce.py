"""The REINFORCE estimator of hard attention (Sec. 4.1), verified rather than assumed.

(a) On a toy problem small enough to enumerate all 3^3 = 27 location sequences, the mean of the
    estimator over many samples matches the exact gradient of the bound L_s = sum_s p(s|a) log p(y|s,a)
    within 4 standard errors, for each baseline; without the REINFORCE term it does not.
(b) Each caption's reward stays with its own samples when the captions of a batch have different
    lengths, whatever the row order and the padding.
(c) The moving-average baseline follows b <- 0.9 b + 0.1 mean r and survives checkpoints.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from captioning.data.vocab import Vocabulary
from captioning.model.paper import (
    AdditiveScore,
    AttentionDecoder,
    HardAttention,
    Reinforce,
    ReinforceTerms,
    caption_log_likelihood,
    cross_entropy,
)
from tests.given_locations import GivenLocations

GRID, D, H, A, V = (1, 3), 8, 16, 8, 11
L = GRID[0] * GRID[1]
PAD, START, END = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id


def toy_decoder(sequences: torch.Tensor | None = None, seed: int = 0) -> AttentionDecoder:
    torch.manual_seed(seed)
    attention = HardAttention(AdditiveScore(annotation_dim=D, hidden_dim=H, attention_dim=A), expectation_prob=0.0)
    if sequences is not None:
        attention = GivenLocations(attention.score, sequences)
    return AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                            dropout=0.0).train()


def toy_problem() -> tuple[torch.Tensor, torch.Tensor]:
    """One image of 3 cells and one caption of 2 words + <end>: 3 steps, 27 location sequences."""
    annotations = 2 * torch.randn(1, L, D, generator=torch.Generator().manual_seed(7))
    tokens = torch.tensor([[START, 5, 8, END]])
    return annotations, tokens


def exact_gradient(decoder_seed: int = 0) -> tuple[list[torch.Tensor], float]:
    """d/dW of L_s = sum_s p(s|a) log p(y|s,a), by enumerating every s; and E_s[log p(y|s,a)]."""
    annotations, tokens = toy_problem()
    steps = tokens.shape[1] - 1
    sequences = torch.tensor(list(itertools.product(range(L), repeat=steps)))  # [27, 3]
    count = len(sequences)
    decoder = toy_decoder(sequences, decoder_seed)
    output = decoder(annotations.expand(count, L, D), tokens[:, :-1].expand(count, steps))
    targets = tokens[:, 1:].expand(count, steps)
    log_p_y = caption_log_likelihood(output.logits, targets, torch.ones(count, steps))  # [27]
    p_s = output.log_probs.sum(1).exp()  # [27], p(s|a) = prod_t alpha_t[s_t]
    assert float(p_s.detach().sum()) == pytest.approx(1.0, abs=1e-6)  # the enumeration is complete
    bound = (p_s * log_p_y).sum()
    return list(torch.autograd.grad(bound, list(decoder.parameters()))), float(bound.detach())


def estimated_gradient(reinforce: Reinforce, *, chunks: int = 12, rows: int = 2048,
                       seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The estimator as train_step computes it, averaged over chunks x rows samples: the mean of each
    parameter's gradient estimate and its standard error (from the spread of the chunk means)."""
    annotations, tokens = toy_problem()
    decoder = toy_decoder(seed=0)
    steps = tokens.shape[1] - 1
    torch.manual_seed(seed)
    means = []
    for _ in range(chunks):
        inputs, targets = tokens[:, :-1].expand(rows, steps), tokens[:, 1:].expand(rows, steps)
        mask = torch.ones(rows, steps)
        output = decoder(annotations.expand(rows, L, D), inputs)
        surrogate = reinforce(logits=output.logits, targets=targets, mask=mask, log_probs=output.log_probs,
                              entropies=output.entropies, locations=output.locations).loss
        loss = cross_entropy(output.logits, targets, mask) + surrogate
        # loss = -(1 / (rows * steps)) sum_n [log p(y|s_n) + lambda_r (r_n - b_n) log p(s_n)]: its gradient
        # times -steps is the mean over rows of the per-caption estimator of d L_s.
        means.append([-steps * g for g in torch.autograd.grad(loss, list(decoder.parameters()))])
    mean = [torch.stack(g).mean(0) for g in zip(*means)]
    error = [torch.stack(g).std(0) / chunks ** 0.5 for g in zip(*means)]
    return mean, error


def worst_deviation(mean: list[torch.Tensor], error: list[torch.Tensor], exact: list[torch.Tensor]) -> float:
    """max over every parameter entry of |estimate - exact| / (standard error + 1e-4)."""
    return max(float(((m - e).abs() / (s + 1e-4)).max()) for m, s, e in zip(mean, error, exact))


@pytest.fixture(scope="module")
def exact() -> tuple[list[torch.Tensor], float]:
    return exact_gradient()


@pytest.mark.parametrize("baseline, samples", [("none", 1), ("moving_average", 1), ("leave_one_out", 4)])
def test_the_estimator_is_unbiased_on_an_enumerable_toy_problem(exact, baseline, samples):
    gradient, expected_reward = exact
    reinforce = Reinforce(baseline=baseline, location_samples=samples)
    reinforce.value = expected_reward + 0.5  # a moving average that has run for a while, slightly off
    mean, error = estimated_gradient(reinforce)
    # Tolerance: every entry within 4 standard errors (+1e-4 for entries whose gradient is ~0).
    assert worst_deviation(mean, error, gradient) < 4.0
    # and the gradient is not trivially small: the check has something to check
    assert max(float(g.abs().max()) for g in gradient) > 0.05


def test_without_the_reinforce_term_the_estimate_is_biased(exact):
    gradient, _ = exact
    mean, error = estimated_gradient(Reinforce(weight=0.0, baseline="none"))
    assert worst_deviation(mean, error, gradient) > 20.0  # the control: the check above can fail


# (b) each caption's reward stays with its own samples ------------------------------------------------

def batch(order: list[int], extra_padding: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three captions of 4, 1 and 2 words (+ <end>) on three images, in `order`, padded to the
    longest plus `extra_padding` columns; with each its own fixed location sequence."""
    captions = [[START, 4, 5, 6, 7, END], [START, 9, END], [START, 10, 4, END]]
    images = 2 * torch.randn(3, L, D, generator=torch.Generator().manual_seed(3))
    cells = torch.randint(0, L, (3, 12), generator=torch.Generator().manual_seed(4))  # [3, steps], per caption
    width = max(len(c) for c in captions) + extra_padding
    tokens = torch.full((3, width), PAD)
    for row, image in enumerate(order):
        tokens[row, : len(captions[image])] = torch.tensor(captions[image])
    return images[order], tokens, cells[order][:, : width - 1]


def reinforce_loss(order: list[int], extra_padding: int = 0) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The training loss times the number of real words (a sum over captions), the per-row rewards,
    and the decoder's parameters."""
    annotations, tokens, cells = batch(order, extra_padding)
    decoder = toy_decoder(cells, seed=1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mask = (targets != PAD).float()
    output = decoder(annotations, inputs)
    reinforce = Reinforce(weight=1.0, entropy_weight=0.1)
    reinforce.value = -6.0
    surrogate = reinforce(logits=output.logits, targets=targets, mask=mask, log_probs=output.log_probs,
                          entropies=output.entropies, locations=output.locations).loss
    rewards = caption_log_likelihood(output.logits, targets, mask)
    loss = cross_entropy(output.logits, targets, mask) + surrogate
    return loss * mask.sum(), rewards.detach(), list(decoder.parameters())


@pytest.mark.parametrize("order, extra_padding", [([2, 0, 1], 0), ([1, 2, 0], 3), ([0, 1, 2], 5)])
def test_rewards_and_gradients_follow_their_captions_in_any_order_and_padding(order, extra_padding):
    reference, rewards, parameters = reinforce_loss([0, 1, 2])
    gradient = torch.autograd.grad(reference, parameters)
    shuffled, shuffled_rewards, shuffled_parameters = reinforce_loss(order, extra_padding)
    torch.testing.assert_close(shuffled_rewards, rewards[order])  # row n's reward is caption order[n]'s
    torch.testing.assert_close(shuffled, reference)
    for g, s in zip(gradient, torch.autograd.grad(shuffled, shuffled_parameters)):
        torch.testing.assert_close(s, g, rtol=1e-5, atol=1e-6)


def test_the_batch_term_is_the_sum_of_each_caption_alone():
    """Caption by caption, unpadded, each with its own samples: the batch's summed terms agree."""
    together, rewards, parameters = reinforce_loss([0, 1, 2])
    gradient = torch.autograd.grad(together, parameters)
    alone_total = [torch.zeros_like(p) for p in parameters]
    for image in range(3):
        annotations, tokens, cells = batch([0, 1, 2])
        length = int((tokens[image] != PAD).sum())
        decoder = toy_decoder(cells[image: image + 1, : length - 1], seed=1)
        inputs, targets = tokens[image: image + 1, : length - 1], tokens[image: image + 1, 1:length]
        mask = torch.ones_like(targets, dtype=torch.float)
        output = decoder(annotations[image: image + 1], inputs)
        reinforce = Reinforce(weight=1.0, entropy_weight=0.1)
        reinforce.value = -6.0
        terms = reinforce(logits=output.logits, targets=targets, mask=mask, log_probs=output.log_probs,
                          entropies=output.entropies, locations=output.locations)
        surrogate, stats = terms.loss, terms.stats
        assert stats["reward"] == pytest.approx(float(rewards[image]), rel=1e-5)  # its own words only
        loss = (cross_entropy(output.logits, targets, mask) + surrogate) * mask.sum()
        for total, g in zip(alone_total, torch.autograd.grad(loss, list(decoder.parameters()))):
            total += g
    for g, alone in zip(gradient, alone_total):
        torch.testing.assert_close(alone, g, rtol=1e-5, atol=1e-6)


def test_surrogate_gradient_per_step_is_the_captions_own_advantage():
    """d surrogate / d log p(s_nt) = -lambda_r (r_n - b) m_nt / sum m, with r_n from row n alone."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, V, generator=generator)
    targets = torch.tensor([[4, 5, END, PAD, PAD], [6, 7, 8, 9, END], [10, END, PAD, PAD, PAD]])
    mask = (targets != PAD).float()
    log_probs = (-torch.rand(3, 5, generator=generator)).requires_grad_(True)
    locations = torch.tensor([[0, 1, 2, 0, 0], [1, 1, 1, 1, 1], [-1, -1, -1, -1, -1]])  # row 2: expectation
    reinforce = Reinforce(weight=0.7)
    reinforce.value = -10.0
    loss = reinforce(logits=logits, targets=targets, mask=mask, log_probs=log_probs,
                     entropies=torch.zeros(3, 5), locations=locations).loss
    (gradient,) = torch.autograd.grad(loss, log_probs)
    for n in range(3):
        words = int(mask[n].sum())
        reward = sum(float(torch.log_softmax(logits[n, t], 0)[targets[n, t]]) for t in range(words))
        sampled = n != 2
        for t in range(5):
            expected = -0.7 * (reward + 10.0) / mask.sum() if (t < words and sampled) else 0.0
            assert float(gradient[n, t]) == pytest.approx(float(expected), rel=1e-5, abs=1e-7), (n, t)


def test_the_warmup_brings_both_terms_in_linearly_by_the_runs_step():
    """At the run's step n (steps done before this one) both terms count min(1, (n + 1) / warmup):
    a resumed run, told its step, goes on where the schedule was."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, V, generator=generator)
    targets = torch.tensor([[4, 5, END], [6, END, PAD]])
    mask = (targets != PAD).float()
    terms = {"log_probs": -torch.rand(2, 3, generator=generator), "entropies": torch.rand(2, 3, generator=generator),
             "locations": torch.zeros(2, 3, dtype=torch.long)}

    def surrogate(reinforce, step):
        done = reinforce(logits=logits, targets=targets, mask=mask, step=step, **terms)
        reinforce.move(done)  # the step applied: the baseline moves
        return float(done.loss)

    full, ramped = Reinforce(entropy_weight=0.3), Reinforce(entropy_weight=0.3, weight_warmup=4)
    for step in range(6):
        want, got = surrogate(full, step), surrogate(ramped, step)  # same rewards, same baseline history
        assert got == pytest.approx(min(1.0, (step + 1) / 4) * want, rel=1e-6), step
        if step == 1:  # a checkpoint here: the resumed run goes on with its third step at 3/4
            resumed, reference = Reinforce(entropy_weight=0.3, weight_warmup=4), Reinforce(entropy_weight=0.3)
            resumed.load_state_dict(ramped.state_dict())
            reference.load_state_dict(full.state_dict())
            assert resumed.value == ramped.value and resumed.value is not None
            assert surrogate(resumed, 2) == pytest.approx(0.75 * surrogate(reference, 2), rel=1e-6)


# (c) the baseline ------------------------------------------------------------------------------------

def _terms(rewards: torch.Tensor, sampled: torch.Tensor) -> ReinforceTerms:
    """What a step's terms carry for the moving average: the captions that sampled, their mean reward
    (as the surrogate pools them)."""
    count, total = float(sampled.sum()), float(rewards[sampled].sum()) if sampled.any() else 0.0
    return ReinforceTerms(loss=torch.zeros(()), stats={}, sampled=count, reward=total / max(count, 1.0))


def test_moving_average_baseline_update_and_state():
    reinforce = Reinforce(baseline_decay=0.9)
    rewards, sampled = torch.tensor([-4.0, -8.0, -100.0]), torch.tensor([True, True, False])
    first = reinforce.baselines(rewards, sampled)
    torch.testing.assert_close(first, torch.full((3,), -6.0))  # first batch: its own mean (of sampled rows)
    reinforce.move(_terms(rewards, sampled))
    assert reinforce.value == pytest.approx(-6.0)
    reinforce.move(_terms(torch.tensor([-2.0, -50.0]), torch.tensor([True, False])))  # expectation row out
    assert reinforce.value == pytest.approx(0.9 * -6.0 + 0.1 * -2.0)
    reinforce.move(_terms(torch.tensor([-3.0]), torch.tensor([False])))  # nothing sampled: b stays
    assert reinforce.value == pytest.approx(-5.6)
    reinforce.move(ReinforceTerms(loss=torch.zeros(()), stats={}, sampled=2.0, reward=float("nan")))
    assert reinforce.value == pytest.approx(-5.6)  # a mean that is not finite never enters
    restored = Reinforce()
    restored.load_state_dict(reinforce.state_dict())
    assert restored.value == reinforce.value and isinstance(reinforce.state_dict()["baseline"], float)
    empty = Reinforce()
    empty.load_state_dict({})  # a checkpoint from before hard attention
    assert empty.value is None


def test_leave_one_out_uses_the_other_samples_of_the_same_caption():
    reinforce = Reinforce(baseline="leave_one_out", location_samples=3)
    reinforce.value = -20.0
    rewards = torch.tensor([-1.0, -2.0, -6.0, -10.0, -30.0, -50.0])  # two captions x 3 samples
    sampled = torch.tensor([True, True, True, True, False, True])
    expected = torch.tensor([-4.0, -3.5, -1.5, -50.0, -30.0, -10.0])  # 2nd caption: one other sampled replica
    torch.testing.assert_close(reinforce.baselines(rewards, sampled)[sampled], expected[sampled])
    lone = torch.tensor([True, False, False, True, True, True])
    assert float(reinforce.baselines(rewards, lone)[0]) == -20.0  # no other sample: the moving average
    assert torch.equal(Reinforce(baseline="none").baselines(rewards, sampled), torch.zeros(6))


def test_the_statistics_say_what_the_batch_did_and_an_unsampled_batch_moves_nothing():
    """The statistics a run logs, each recomputed here by hand: the surrogate, the mean reward of the
    captions that sampled, the baseline they were compared with, their share, the warm-up's scale at
    the default step 0, and the mean entropy over their real steps. The baseline moves only when
    told the step was applied (`move`), by the batch's mean reward. A batch where no caption sampled
    leaves the baseline as it was, also before the first move."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, V, generator=generator)
    targets = torch.tensor([[4, 5, END, PAD], [6, 7, 8, END], [9, END, PAD, PAD]])
    mask = (targets != PAD).float()
    entropies = torch.rand(3, 4, generator=generator)
    log_probs = -torch.rand(3, 4, generator=generator)
    locations = torch.tensor([[0, 2, 1, 0], [-1, -1, -1, -1], [1, 1, 0, 0]])  # row 1: the expectation
    reinforce = Reinforce(weight=0.5, entropy_weight=0.3, weight_warmup=4)
    reinforce.value = -10.0
    terms = reinforce(logits=logits, targets=targets, mask=mask, log_probs=log_probs,
                      entropies=entropies, locations=locations)  # step left at its default, 0
    loss, stats = terms.loss, terms.stats

    def reward(n: int) -> float:
        return sum(float(torch.log_softmax(logits[n, t], 0)[targets[n, t]]) for t in range(4) if mask[n, t])

    mean_reward = (reward(0) + reward(2)) / 2
    entropy = (float(entropies[0, :3].sum()) + float(entropies[2, :2].sum())) / 5  # 3 + 2 real sampled steps
    assert set(stats) == {"reinforce", "reward", "baseline", "sampled", "reinforce_scale", "entropy"}
    assert stats["reinforce"] == pytest.approx(float(loss))
    assert stats["reward"] == pytest.approx(mean_reward, rel=1e-6)
    assert stats["baseline"] == -10.0 and reinforce.value == -10.0  # compared with b; not moved yet
    reinforce.move(terms)
    assert reinforce.value == pytest.approx(0.9 * -10.0 + 0.1 * mean_reward, rel=1e-6)
    assert (terms.sampled, terms.reward) == (2.0, stats["reward"])
    assert stats["sampled"] == pytest.approx(2 / 3)
    assert stats["reinforce_scale"] == 0.25  # min(1, (0 + 1) / 4)
    assert stats["entropy"] == pytest.approx(entropy, rel=1e-6)

    one_step = Reinforce()  # a single sampled real step: its entropy is the mean
    stats = one_step(logits=logits[2:, :1], targets=torch.tensor([[END]]), mask=torch.ones(1, 1),
                     log_probs=log_probs[2:, :1], entropies=entropies[2:, :1], locations=locations[2:, :1]).stats
    assert stats["entropy"] == pytest.approx(float(entropies[2, 0]))
    first = float(torch.log_softmax(logits[2, 0], 0)[END])
    assert stats["baseline"] == pytest.approx(first, rel=1e-6)  # the first batch: its own mean reward

    nothing = torch.full((3, 4), -1)
    for before in (None, -10.0):
        unmoved = Reinforce()
        unmoved.value = before
        terms = unmoved(logits=logits, targets=targets, mask=mask, log_probs=log_probs, entropies=entropies,
                        locations=nothing)
        unmoved.move(terms)
        stats = terms.stats
        assert unmoved.value == before
        assert stats["baseline"] == (0.0 if before is None else before) and stats["sampled"] == 0.0


def test_from_config_passes_every_setting():
    from captioning.config import ReinforceConfig

    settings = {"weight": 0.7, "entropy_weight": 0.2, "baseline": "leave_one_out", "baseline_decay": 0.5,
                "location_samples": 3, "weight_warmup": 5}
    reinforce = Reinforce.from_config(ReinforceConfig(**settings), across=torch.neg)
    assert (reinforce.weight, reinforce.entropy_weight, reinforce.baseline, reinforce.decay, reinforce.location_samples,
            reinforce.weight_warmup) == tuple(settings.values())
    assert reinforce.across is torch.neg and Reinforce.from_config(ReinforceConfig()).across(torch.ones(1)) == 1


def test_the_moving_average_baseline_ignores_the_other_samples_of_a_caption():
    """With several samples per caption and the paper's baseline, every row's b is the moving average,
    not the mean of its caption's other samples (that is leave_one_out)."""
    reinforce = Reinforce(baseline="moving_average", location_samples=2)
    reinforce.value = -20.0
    rewards, sampled = torch.tensor([-1.0, -3.0, -5.0, -7.0]), torch.ones(4, dtype=torch.bool)
    torch.testing.assert_close(reinforce.baselines(rewards, sampled), torch.full((4,), -20.0))


def test_the_defaults_are_the_papers():
    """Sec. 4.1: lambda_r = 1, no entropy term, the moving average b <- 0.9 b + 0.1 r, one sample, no
    warm-up (both terms count fully from the first step)."""
    paper = Reinforce()
    assert (paper.weight, paper.entropy_weight, paper.baseline, paper.decay, paper.location_samples,
            paper.weight_warmup) == (1.0, 0.0, "moving_average", 0.9, 1, 0)
    assert paper.scale(0) == 1.0


def test_hard_attention_training_keeps_the_baseline_in_checkpoints_and_resumes_exactly(tmp_path, tiny_config):
    """Run A: 10 steps straight. Run B: 5 steps, stop, resume to 10. Same weights and baseline; and a
    resume that lost the baseline would not be the same run (the control)."""
    from captioning.train.loop import fit

    hard = ("model.attention=hard", "train.eval_every_steps=5", "train.reinforce.weight_warmup=8")
    fit(tiny_config(tmp_path / "a", "train.max_steps=10", *hard))
    fit(tiny_config(tmp_path / "b", "train.max_steps=5", *hard))
    stopped = torch.load(tmp_path / "b" / "last.pt", map_location="cpu", weights_only=True)
    assert isinstance(stopped["reinforce"]["baseline"], float) and stopped["reinforce"]["baseline"] < 0
    for name, lose_baseline in (("b", False), ("c", True)):
        if lose_baseline:  # the same interrupted run, resumed from a checkpoint without its baseline
            (tmp_path / "c").mkdir()
            torch.save({**stopped, "reinforce": {"baseline": None}}, tmp_path / "c" / "last.pt")
            (tmp_path / "c" / "vocab.json").write_text((tmp_path / "b" / "vocab.json").read_text())
        fit(tiny_config(tmp_path / name, "train.max_steps=10", *hard), resume=True)
    a, b, c = (torch.load(tmp_path / n / "last.pt", map_location="cpu", weights_only=True) for n in "abc")
    assert a["reinforce"]["baseline"] == b["reinforce"]["baseline"]
    for name in a["decoder"]:
        assert torch.equal(a["decoder"][name], b["decoder"][name]), name
    assert c["reinforce"]["baseline"] != a["reinforce"]["baseline"]
    assert not torch.equal(a["decoder"]["attention.score.v.weight"], c["decoder"]["attention.score.v.weight"])


@pytest.mark.parametrize("baseline", ["moving_average", "leave_one_out"])
def test_processes_that_pool_their_rewards_move_one_baseline_the_one_process_baseline(baseline: str) -> None:
    """Under torchrun each process holds a part of the batch; `across` sums over the processes, so
    every part's Reinforce moves the baseline by the global batch's mean reward, as one process does.
    A stand-in part (`counted` False) adds nothing, however its rows sampled."""
    generator = torch.Generator().manual_seed(0)
    whole = Reinforce(baseline=baseline, location_samples=2, baseline_decay=0.5)
    parts = [Reinforce(baseline=baseline, location_samples=2, baseline_decay=0.5) for _ in range(3)]
    for _ in range(3):  # the first batch sets b, the next ones move it
        rows, steps, vocab = 12, 5, 7
        logits = torch.randn(rows, steps, vocab, generator=generator)
        targets = torch.randint(0, vocab, (rows, steps), generator=generator)
        mask = (torch.rand(rows, steps, generator=generator) < 0.8).float()
        mask[:, 0] = 1
        locations = torch.randint(-1, 4, (rows, steps), generator=generator)
        locations[:4] = -1  # the first part's images took the expectation: it sampled nothing
        inputs = {"logits": logits, "targets": targets, "mask": mask, "log_probs": torch.randn(rows, steps),
                  "entropies": torch.rand(rows, steps), "locations": locations}
        whole.move(whole(**inputs))
        split = [slice(0, 4), slice(4, 12), slice(12, 12)]  # the third part is empty: a stand-in row instead
        stand_in = {name: value[4:6] for name, value in inputs.items()}  # rows that did sample: only counted=False
        shares = [{name: value[part] for name, value in inputs.items()} for part in split[:2]] + [stand_in]
        counts = (True, True, False)
        sums = []
        for reinforce, share, counted in zip(parts, shares, counts):
            reinforce.across = lambda tensor: tensor  # first pass: each part's own sums
            rewards = caption_log_likelihood(share["logits"], share["targets"], share["mask"])
            sums.append(reinforce.pooled(rewards, (share["locations"] >= 0).any(dim=1), counted=counted))
        total = torch.stack(sums).sum(0)
        for reinforce, share, counted in zip(parts, shares, counts):
            calls = []
            reinforce.across = lambda tensor, total=total, calls=calls: calls.append(1) or total  # the all-reduce
            reinforce.move(reinforce(**share, counted=counted))
            assert len(calls) == 1  # one all-reduce a step, also for the first batch's baseline
        assert sums[2].abs().sum() == 0  # the stand-in counted nothing
        for reinforce in parts:
            assert reinforce.value == pytest.approx(whole.value, rel=1e-6)


# a batch that is not finite --------------------------------------------------------------------------

def baseline_kept_through_the_skipped_step(log: Path, skipped: int, decay: float = 0.9) -> None:
    """From a run's log.jsonl (one line per step, rank 0's): step `skipped` is not logged, the
    baseline the next step compared with is the one after the step before the skipped one (kept
    through it), and the step after that compares with it moved by the next good batch's reward.
    Each logged "baseline" is the moving average before that step's move, "reward" the mean reward
    that moves it."""
    entries = {entry["step"]: entry for entry in map(json.loads, log.read_text().splitlines()) if "loss" in entry}
    before, after, next_after = entries[skipped - 1], entries[skipped + 1], entries[skipped + 2]
    assert skipped not in entries
    kept = decay * before["baseline"] + (1 - decay) * before["reward"]
    assert after["baseline"] == pytest.approx(kept, rel=1e-6)  # logged in float32
    assert next_after["baseline"] == pytest.approx(decay * kept + (1 - decay) * after["reward"], rel=1e-6)
    assert next_after["baseline"] != pytest.approx(kept)  # it moves again
    assert all(math.isfinite(entry[name]) for entry in entries.values() for name in ("loss", "baseline", "reward"))


def finite_checkpoint(path: Path) -> dict:
    """The checkpoint, after checking that every number in it is finite: weights, optimizer moments,
    the baseline."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    assert all(torch.isfinite(value).all() for value in payload["decoder"].values())
    moments = [value for state in payload["optimizer"]["state"].values() for value in state.values()
               if isinstance(value, torch.Tensor)]
    assert moments and all(torch.isfinite(value).all() for value in moments)
    assert math.isfinite(payload["reinforce"]["baseline"])
    return payload


def test_a_nan_batch_leaves_hard_attentions_baseline_as_it_was_and_the_run_goes_on(tmp_path, tiny_config,
                                                                                    monkeypatch):
    """A batch whose annotations are NaN makes every reward NaN. Its step is skipped; the moving
    average keeps its value through it (before, the NaN entered it and every later step was NaN,
    even for captions that took the expectation: 0 x NaN), moves again on the next good batch, and
    the checkpoint holds no NaN; a run resumed from it trains."""
    from captioning.train import loop
    from captioning.train.loop import fit

    real_step = loop.Run.step

    def step_with_a_nan_batch(self, batch, *, size):
        if self.progress.step + 1 == 4:
            batch = type(batch)(annotations=batch.annotations * float("nan"), tokens=batch.tokens,
                                lengths=batch.lengths)
        return real_step(self, batch, size=size)

    monkeypatch.setattr(loop.Run, "step", step_with_a_nan_batch)
    hard = ("model.attention=hard", "model.dropout=0", "train.log_every_steps=1")
    out = tmp_path / "run"
    summary = fit(tiny_config(out, "train.max_steps=7", *hard))
    assert summary["steps"] == 7
    baseline_kept_through_the_skipped_step(out / "log.jsonl", skipped=4)
    assert finite_checkpoint(out / "last.pt")["progress"]["skipped_steps"] == 1
    monkeypatch.setattr(loop.Run, "step", real_step)
    fit(tiny_config(out, "train.max_steps=10", *hard), resume=True)
    resumed = finite_checkpoint(out / "last.pt")
    assert resumed["progress"]["step"] == 10 and resumed["progress"]["skipped_steps"] == 1


@pytest.mark.parametrize("baseline", ["none", "moving_average", "leave_one_out"])
def test_a_caption_that_sampled_nothing_carries_no_nan_into_the_terms(baseline):
    """The advantage of a caption whose image took the expectation is exactly 0, whatever its reward:
    a NaN there (0 x NaN) would make the whole surrogate NaN, and its reward enters neither the pooled
    mean nor another replica's leave-one-out baseline (rows 0-2: one image's 3 samples)."""
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 3, V, generator=generator)
    logits[1] = float("nan")  # row 1: a reward that is not finite...
    targets = torch.tensor([[4, 5, END], [4, 5, END], [4, 5, END], [9, END, PAD], [9, END, PAD], [9, END, PAD]])
    mask = (targets != PAD).float()
    locations = torch.tensor([[0, 1, 2], [-1, -1, -1], [2, 2, 1], [1, 0, 0], [0, 0, 0], [2, 1, 0]])  # ...sampled none
    log_probs = -torch.rand(6, 3, generator=generator) * (locations >= 0)
    reinforce = Reinforce(baseline=baseline, location_samples=3 if baseline == "leave_one_out" else 1)
    reinforce.value = -5.0
    terms = reinforce(logits=logits, targets=targets, mask=mask, log_probs=log_probs.requires_grad_(True),
                      entropies=torch.rand(6, 3, generator=generator), locations=locations)
    assert math.isfinite(float(terms.loss.detach())) and math.isfinite(terms.reward)
    assert all(math.isfinite(value) for value in terms.stats.values())
    (gradient,) = torch.autograd.grad(terms.loss, log_probs)
    assert torch.isfinite(gradient).all() and (gradient[1] == 0).all() and (gradient[0] != 0).any()
