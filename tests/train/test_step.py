"""The parameter update of one training step is the gradient of the documented objective.

The reference is written here from the paper (Eq. 14, Sec. 4.1) with plain torch ops on the decoder's
own outputs: each caption's summed word costs + lambda * its doubly stochastic term + (hard attention)
the REINFORCE surrogate, summed over the captions and divided by the batch's real words. SGD with
lr=1, no momentum and no effective clipping makes the update equal the gradient.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from captioning.data.dataset import Batch
from captioning.data.vocab import Vocabulary
from captioning.model.paper import AdditiveScore, AttentionDecoder, Draws, HardAttention, Reinforce, SoftAttention
from captioning.runtime.distributed import Agreement
from captioning.train.objective import Loss
from captioning.train.paper_objective import expectation_prob_at, row_uniforms, train_step
from captioning.train.step import apply_gradients, stand_in_batch, take_step

B, L, D, H, V = 4, 9, 8, 16, 12
PAD, START, END = Vocabulary.pad_id, Vocabulary.start_id, Vocabulary.end_id
DS_LAMBDA = 2.0  # not 1, so that a missing weight shows
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
    # hard attention: each caption's coin at the paper's chance, flipped by the step before the forward
    draws = Draws(expectation_prob=0.5) if hard else None
    out = decoder(batch.annotations, inputs, lengths=mask.sum(1).long(), draws=draws)
    word_log_probs = torch.log_softmax(out.logits, dim=2).gather(2, targets[:, :, None])[:, :, 0]  # [B, T]
    words = mask.sum()
    xe = -(word_log_probs * mask).sum() / words
    # Eq. 14 with tau = 1: per caption, sum over cells of (1 - sum over real steps of alpha)^2; like the
    # word costs, summed over the captions and divided by the real words
    coverage = (out.alphas * mask[:, :, None]).sum(1)  # [B, L]
    ds = ((1.0 - coverage) ** 2).sum() / words
    objective = xe + DS_LAMBDA * ds
    if hard:
        # Sec. 4.1: reward log p(y|s,a), baseline = the first batch's mean reward over sampled captions
        sampled = (out.locations >= 0).any(1).float()  # [B]
        reward = (word_log_probs * mask).sum(1).detach()  # [B]
        baseline = (reward * sampled).sum() / sampled.sum()
        score_function = ((reward - baseline) * sampled * (out.log_probs * mask).sum(1)).sum()
        entropy = (sampled * (out.entropies * mask).sum(1)).sum()
        objective = objective - (REINFORCE_WEIGHT * score_function + ENTROPY_WEIGHT * entropy) / words
    return objective, DS_LAMBDA * ds, out.locations


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_one_step_moves_the_weights_by_the_gradient_of_the_documented_objective(kind: str) -> None:
    hard = kind == "hard"
    decoder, batch = make_decoder(kind), make_batch()
    reference = copy.deepcopy(decoder)
    before = {name: p.detach().clone() for name, p in decoder.named_parameters()}

    torch.manual_seed(11)  # the same coins and samples in both: the seed is reset before each forward
    optimizer = torch.optim.SGD(decoder.parameters(), lr=1.0)
    reinforce = Reinforce(weight=REINFORCE_WEIGHT, entropy_weight=ENTROPY_WEIGHT) if hard else None
    result = train_step(decoder, batch, optimizer, grad_clip=1e9, ds_lambda=DS_LAMBDA,
                        reinforce=reinforce)

    torch.manual_seed(11)
    objective, ds_part, locations = objective_by_hand(reference, batch, hard=hard)
    names = [name for name, _ in reference.named_parameters()]
    gradients = torch.autograd.grad(objective, list(reference.parameters()), retain_graph=True, allow_unused=True)
    ds_gradients = torch.autograd.grad(ds_part, list(reference.parameters()), allow_unused=True)

    if hard:  # the case is only a test of the sampled-rows mask if the coin went both ways
        sampled = (locations >= 0).any(1)
        assert 0 < int(sampled.sum()) < B, locations
    assert result.losses["loss"] == pytest.approx(float(objective.detach()), rel=1e-5)
    moved = 0.0
    for name, gradient, ds_gradient in zip(names, gradients, ds_gradients):
        param = dict(decoder.named_parameters())[name]
        update = before[name] - param.detach()
        expected = torch.zeros_like(update) if gradient is None else gradient
        torch.testing.assert_close(update, expected, rtol=1e-4, atol=1e-6, msg=name)
        if ds_gradient is not None:
            moved = max(moved, float(ds_gradient.abs().max()))
    assert moved > 1e-2  # the doubly stochastic term moves the weights far beyond the tolerance


def terms_by_hand(decoder: AttentionDecoder, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy, doubly stochastic term) of soft attention, from objective_by_hand."""
    objective, ds_part, _ = objective_by_hand(decoder, batch, hard=False)
    return objective - ds_part, ds_part / DS_LAMBDA


def test_the_agreed_share_weights_every_term_and_the_returned_losses_stay_this_processs_own() -> None:
    """Under torchrun the update is words_share * (xe + lambda * ds): both terms are sums over the
    captions divided by the words; the losses reported (and the one handed to `agree`) are the
    unweighted local ones."""
    decoder, batch = make_decoder("soft"), make_batch()
    reference = copy.deepcopy(decoder)
    before = {name: p.detach().clone() for name, p in decoder.named_parameters()}
    handed = []

    def agree(loss: torch.Tensor) -> Agreement:
        handed.append(float(loss.detach()))
        return Agreement(share=0.5)

    optimizer = torch.optim.SGD(decoder.parameters(), lr=1.0)
    result = train_step(decoder, batch, optimizer, grad_clip=1e9, ds_lambda=DS_LAMBDA, agree=agree)

    xe, ds = terms_by_hand(reference, batch)
    local = float((xe + DS_LAMBDA * ds).detach())
    assert handed == [pytest.approx(local, rel=1e-5)]
    assert result.losses["loss"] == pytest.approx(local, rel=1e-5)
    assert result.losses["xe"] == pytest.approx(float(xe.detach()), rel=1e-5)
    assert result.losses["ds"] == pytest.approx(float(ds.detach()), rel=1e-5)
    assert not result.skipped
    weighted = 0.5 * (xe + DS_LAMBDA * ds)
    gradients = torch.autograd.grad(weighted, list(reference.parameters()), allow_unused=True)
    for (name, param), gradient in zip(decoder.named_parameters(), gradients):
        expected = torch.zeros_like(param) if gradient is None else gradient
        torch.testing.assert_close(before[name] - param.detach(), expected, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("agreement", [Agreement(finite=False), Agreement(empty=True)],
                         ids=["another-process-not-finite", "no-process-has-an-image"])
@pytest.mark.parametrize("scaled", [False, True])
def test_an_agreed_skip_moves_no_weight_and_leaves_the_run_steppable(agreement: Agreement, scaled: bool) -> None:
    """This process's own loss and gradients are finite, yet the processes agreed to skip: no update,
    the gradients dropped. A GradScaler (fp16 on a GPU without bf16, under torchrun) ends its
    iteration all the same: `unscale_` ran, so without `update()` the next step's `unscale_` raises.
    The scale moves by the scaler's own rule on the finite gradients it saw (growth_interval=1: it
    doubles), and the next step trains."""
    decoder, batch = make_decoder("soft"), make_batch()
    before = {name: p.detach().clone() for name, p in decoder.named_parameters()}
    optimizer = torch.optim.SGD(decoder.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1) if scaled else None
    result = train_step(decoder, batch, optimizer, grad_clip=1e9, ds_lambda=DS_LAMBDA,
                        scaler=scaler, agree=lambda loss: agreement)
    assert result.skipped
    assert math.isfinite(result.losses["loss"]) and math.isfinite(result.losses["grad_norm"])
    for name, param in decoder.named_parameters():
        assert torch.equal(param.detach(), before[name]), name
        assert param.grad is None, name
    if scaled:
        assert scaler.get_scale() == 8.0
    after = train_step(decoder, batch, optimizer, grad_clip=1e9, ds_lambda=DS_LAMBDA,
                       scaler=scaler, agree=lambda loss: Agreement())
    assert not after.skipped
    assert any(not torch.equal(param.detach(), before[name]) for name, param in decoder.named_parameters())
    if scaled:
        assert scaler.get_scale() == 16.0


def test_an_agreed_skip_with_gradients_that_are_not_finite_backs_the_scale_off() -> None:
    """Another process's non-finite loss reaches every process's gradients through DDP's average:
    the scaler sees inf or NaN in what it unscaled and halves its scale, as its rule says."""
    decoder, batch = make_decoder("soft"), make_batch()
    batch.annotations[0, 0, 0] = float("nan")
    optimizer = torch.optim.SGD(decoder.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    result = train_step(decoder, batch, optimizer, grad_clip=1e9, ds_lambda=DS_LAMBDA,
                        scaler=scaler, agree=lambda loss: Agreement(finite=False))
    assert result.skipped and scaler.get_scale() == 2.0


def test_a_scaled_step_that_is_not_skipped_steps_and_updates_the_scaler() -> None:
    """The control of the test above: the same step agreed finite moves the weights by the
    unscaled gradient and grows the scale."""
    decoder, batch = make_decoder("soft"), make_batch()
    reference = copy.deepcopy(decoder)
    before = {name: p.detach().clone() for name, p in decoder.named_parameters()}
    optimizer = torch.optim.SGD(decoder.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    result = train_step(decoder, batch, optimizer, grad_clip=1e9, ds_lambda=DS_LAMBDA,
                        scaler=scaler, agree=lambda loss: Agreement())
    assert not result.skipped
    assert scaler.get_scale() == 8.0
    xe, ds = terms_by_hand(reference, batch)
    gradients = torch.autograd.grad(xe + DS_LAMBDA * ds, list(reference.parameters()), allow_unused=True)
    for (name, param), gradient in zip(decoder.named_parameters(), gradients):
        expected = torch.zeros_like(param) if gradient is None else gradient
        torch.testing.assert_close(before[name] - param.detach(), expected, rtol=1e-4, atol=1e-6, msg=name)


def test_a_stand_in_batch_moves_no_baseline_of_any_process() -> None:
    """A process whose part of a global batch is empty steps on a stand-in (its terms weigh nothing);
    its captions' rewards must not enter the pooled mean that moves every process's baseline."""
    pooled = []
    reinforce = Reinforce(across=lambda tensor: pooled.append(tensor.clone()) or tensor)
    torch.manual_seed(0)
    decoder = make_decoder("hard")
    decoder.attention.expectation_prob = 0.0  # every caption samples: its reward would count
    for stand_in in (False, True):
        train_step(decoder, make_batch(), torch.optim.SGD(decoder.parameters(), lr=0.0), grad_clip=1e9,
                   ds_lambda=0.0, reinforce=reinforce, stand_in=stand_in)
    assert pooled[0][1] == B and pooled[1].abs().sum() == 0  # [sum of rewards, captions that sampled]


def test_the_stand_in_batch_is_one_blank_image_captioned_start_end() -> None:
    features = stand_in_batch(annotations=(L, D))
    assert features.annotations.shape == (1, L, D) and not features.annotations.any()
    assert features.images is None
    assert features.tokens.tolist() == [[START, END]]
    assert features.lengths.tolist() == [2]
    pixels = stand_in_batch(images=(3, 32, 32))
    assert pixels.images.shape == (1, 3, 32, 32) and not pixels.images.any()
    assert pixels.annotations is None
    assert pixels.tokens.tolist() == [[START, END]] and pixels.lengths.tolist() == [2]


def test_row_uniforms_do_not_depend_on_how_the_batch_is_split() -> None:
    """Every process draws the global batch's rows from (seed, step) and keeps its own: the parts,
    put together, are the draws of one process holding the whole batch."""
    whole = row_uniforms(seed=3, step=5, size=5, start=0, rows=5, samples=2, width=4)
    assert whole.shape == (10, 5)
    assert ((whole >= 0) & (whole < 1)).all()
    parts = [row_uniforms(seed=3, step=5, size=5, start=start, rows=rows, samples=2, width=4)
             for start, rows in ((0, 2), (2, 0), (2, 3))]
    assert [part.shape[0] for part in parts] == [4, 0, 6]
    assert torch.equal(torch.cat(parts), whole)
    # a slice past the global batch (a stand-in's row) still gets rows of its own, the ones a larger
    # batch would have there
    beyond = row_uniforms(seed=3, step=5, size=5, start=5, rows=1, samples=2, width=4)
    larger = row_uniforms(seed=3, step=5, size=6, start=0, rows=6, samples=2, width=4)
    assert beyond.shape == (2, 5)
    assert torch.equal(beyond, larger[10:])
    assert torch.equal(larger[:10], whole)


def test_row_uniforms_are_the_draws_the_kept_runs_were_trained_with() -> None:
    """A run's draws are a function of (train.seed, step) that must not move between versions: the
    studies' hard-attention runs, and a run resumed under a newer version, train on them. The
    numbers were printed by the version that trained studies/flickr8k's hard_expect0.75 run; an
    image's coin is its first column, the default coin per image."""
    recorded = [[0.10478591918945312, 0.9494840502738953, 0.6751899719238281],
                [0.06222641468048096, 0.43183326721191406, 0.7212383151054382]]
    assert row_uniforms(seed=2, step=7, size=2, start=0, rows=2, samples=1, width=2).tolist() == recorded


def test_row_uniforms_share_the_coin_of_each_image_or_of_the_global_batch_in_every_part() -> None:
    """model.hard.coin: an image's K rows share its first row's coin; with "batch" every row of every
    process takes the global batch's first coin (not its own part's first: one coin per process)."""
    whole = row_uniforms(seed=3, step=5, size=5, start=0, rows=5, samples=2, width=4)
    assert torch.equal(whole[0::2, 0], whole[1::2, 0])  # the two samples of a caption: one coin
    assert len(set(whole[0::2, 0].tolist())) == 5  # and each image its own
    for start, rows in ((0, 2), (2, 3), (4, 1)):
        part = row_uniforms(seed=3, step=5, size=5, start=start, rows=rows, samples=2, width=4, coin="batch")
        assert (part[:, 0] == whole[0, 0]).all(), start
        assert torch.equal(part[:, 1:], whole[start * 2:(start + rows) * 2, 1:])  # the cells' draws as before


def test_row_uniforms_of_a_part_with_pairs_left_out_are_each_pairs_own() -> None:
    """Pairs whose image could not be read leave a process's part (collate_image_pairs): the rows that stay
    keep the draws of their place in the global batch, not the first rows' draws."""
    whole = row_uniforms(seed=3, step=5, size=6, start=0, rows=6, samples=2, width=4)
    kept = torch.tensor([0, 2])  # of the part that starts at pair 3: pairs 3 and 5, pair 4 unreadable
    part = row_uniforms(seed=3, step=5, size=6, start=3, rows=2, samples=2, width=4, positions=kept)
    assert torch.equal(part, whole[[6, 7, 10, 11]])


def test_row_uniforms_change_with_the_step_and_the_seed_and_repeat_with_both() -> None:
    def draws(seed: int, step: int) -> torch.Tensor:
        return row_uniforms(seed=seed, step=step, size=3, start=0, rows=3, samples=1, width=2)

    assert torch.equal(draws(0, 0), draws(0, 0))
    others = [draws(0, 1), draws(1, 0), draws(1, 1), draws(2, 0)]
    for other in others:
        assert not torch.equal(other, draws(0, 0))
    assert not torch.equal(draws(1, 0), draws(0, 1))  # seed and step are not interchangeable


def linear_objective(scale: float = 1.0) -> tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]:
    """A weight w, the objective sum(w * x) (its gradient is x, by hand) and x."""
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    x = torch.tensor([0.25, 1.0, -0.5]) * scale
    return weight, (weight * x).sum(), x


def test_apply_gradients_steps_by_the_gradient_and_returns_its_norm() -> None:
    weight, objective, x = linear_objective()
    optimizer = torch.optim.SGD([weight], lr=1.0)
    applied = apply_gradients(objective.detach(), objective, [weight], optimizer, grad_clip=1e9)
    assert not applied.skipped
    assert applied.norm == pytest.approx(float(x.norm()), rel=1e-6)
    torch.testing.assert_close(weight.detach(), torch.tensor([1.0, -2.0, 0.5]) - x)


def test_apply_gradients_with_a_scaler_steps_by_the_true_gradient_and_updates_the_scale() -> None:
    weight, objective, x = linear_objective()
    optimizer = torch.optim.SGD([weight], lr=1.0)
    # growth_interval=1: one finite step doubles the scale, so a scaler that was not updated shows
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    applied = apply_gradients(objective.detach(), objective, [weight], optimizer, grad_clip=1e9, scaler=scaler)
    assert not applied.skipped
    assert applied.norm == pytest.approx(float(x.norm()), rel=1e-6)  # the norm of the unscaled gradient
    torch.testing.assert_close(weight.detach(), torch.tensor([1.0, -2.0, 0.5]) - x)
    assert scaler.get_scale() == 8.0


def test_apply_gradients_skips_on_a_non_finite_loss_even_with_finite_gradients() -> None:
    """The reported loss can be non-finite while the objective's gradient is not (scst's rewards)."""
    weight, objective, _ = linear_objective()
    optimizer = torch.optim.SGD([weight], lr=1.0)
    applied = apply_gradients(torch.tensor(float("nan")), objective, [weight], optimizer, grad_clip=1e9)
    assert applied.skipped and math.isfinite(applied.norm)
    assert weight.detach().tolist() == [1.0, -2.0, 0.5] and weight.grad is None


def test_apply_gradients_skips_on_non_finite_gradients_even_with_a_finite_loss() -> None:
    weight, objective, _ = linear_objective(scale=float("inf"))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    applied = apply_gradients(torch.tensor(0.0), objective, [weight], optimizer, grad_clip=1e9)
    assert applied.skipped and not math.isfinite(applied.norm)
    assert weight.detach().tolist() == [1.0, -2.0, 0.5] and weight.grad is None


def test_apply_gradients_skips_where_the_processes_agreed_to_and_brings_the_asked_values_to_the_host() -> None:
    """Another process's loss not finite, or no image in any process: this one skips too, though its
    own loss and gradient are finite; `also` comes back as floats, in order, skipped or not."""
    for agreement in (Agreement(finite=False), Agreement(empty=True)):
        weight, objective, x = linear_objective()
        optimizer = torch.optim.SGD([weight], lr=1.0)
        applied = apply_gradients(objective.detach(), objective, [weight], optimizer, grad_clip=1e9,
                                  agreement=agreement, also=(torch.tensor(2.5), torch.tensor(3)))
        assert applied.skipped and applied.values == (2.5, 3.0) and applied.loss == float(objective)
        assert weight.detach().tolist() == [1.0, -2.0, 0.5] and weight.grad is None
    weight, objective, x = linear_objective()
    applied = apply_gradients(objective.detach(), objective, [weight], torch.optim.SGD([weight], lr=1.0),
                              grad_clip=1e9, agreement=Agreement(), also=(torch.tensor(-1.0),))
    assert not applied.skipped and applied.values == (-1.0,)
    torch.testing.assert_close(weight.detach(), torch.tensor([1.0, -2.0, 0.5]) - x)


def test_the_coins_warm_up_from_the_expectation_to_the_papers_chance_by_the_runs_step():
    """model.hard.warmup is the run's schedule, not the model's: linear from 1 to expectation_prob."""
    schedule = [expectation_prob_at(step, expectation_prob=0.5, warmup=4) for step in range(6)]
    assert schedule == [1, 0.875, 0.75, 0.625, 0.5, 0.5]
    assert expectation_prob_at(0, expectation_prob=0.3, warmup=0) == 0.3


def rows_on_the_expectation(decoder: AttentionDecoder) -> list[torch.Tensor]:
    """For each teacher-forced forward of `decoder`, the rows whose coin said "expectation": their
    words chose no cell (location -1), where a sampling row's first word chose one."""
    seen = []
    decoder.register_forward_hook(lambda module, args, output: seen.append(output.locations[:, 0] == -1))
    return seen


@pytest.mark.parametrize(("step", "low", "high"), [(0, 1.0, 1.0), (2, 0.65, 0.85), (9, 0.42, 0.58)])
def test_the_training_step_flips_the_coins_at_the_chance_of_its_step(step, low, high):
    """train_step hands hard attention coins at expectation_prob_at(step) over `hard_warmup` steps, with
    the run's own uniforms (row_uniforms) and without them: a resumed run at step 2 is where the schedule was."""
    decoder, batch = make_decoder("hard"), make_batch()
    many = Batch(annotations=batch.annotations.repeat(100, 1, 1), tokens=batch.tokens.repeat(100, 1),
                 lengths=batch.lengths.repeat(100))  # 400 captions
    seen = rows_on_the_expectation(decoder)
    optimizer = torch.optim.SGD(decoder.parameters(), lr=0.0)
    torch.manual_seed(0)
    train_step(decoder, many, optimizer, grad_clip=1.0, ds_lambda=1.0, step=step, hard_warmup=4)
    uniforms = row_uniforms(seed=0, step=step, size=400, start=0, rows=400, samples=1, width=8)
    train_step(decoder, many, optimizer, grad_clip=1.0, ds_lambda=1.0, step=step, hard_warmup=4,
               uniforms=uniforms)
    assert all(low <= float(coins.float().mean()) <= high for coins in seen) and len(seen) == 2


def test_take_step_moves_what_a_loss_moves_only_when_its_step_is_applied() -> None:
    """A Loss's `applied` (REINFORCE's baseline moving) runs after an applied step and after no
    other: not where the gradient is not finite although the loss is, nor where another process's
    loss was not (what the processes agreed on). Its tensor statistics come back as floats."""
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    moved: list[str] = []

    def loss(name: str, value: torch.Tensor) -> Loss:
        return Loss(value, {"term": 3.0 * weight.sum(), "count": 7.0}, applied=lambda: moved.append(name))

    result = take_step(loss("finite", (weight * 2.0).sum()), [weight], optimizer, grad_clip=1e9)
    assert moved == ["finite"] and not result.skipped
    assert result.losses["term"] == 6.0 and result.losses["count"] == 7.0 and result.losses["loss"] == 4.0
    steep = loss("steep", torch.sqrt(weight[0] - weight[0].detach() + 0.0) + weight[1])  # sqrt at 0: infinite slope
    assert take_step(steep, [weight], optimizer, grad_clip=1e9).skipped and moved == ["finite"]
    elsewhere = take_step(loss("elsewhere", weight.sum()), [weight], optimizer, grad_clip=1e9,
                          agree=lambda _: Agreement(finite=False))
    assert elsewhere.skipped and moved == ["finite"]
