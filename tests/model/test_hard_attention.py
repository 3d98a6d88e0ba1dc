"""Hard attention (Sec. 4.1): one-hot when sampled, the expectation equals soft attention, the
per-image coin, sampling frequencies, the test-time choices, and the decoder and decoding around it."""

from __future__ import annotations

import pytest
import torch

from captioning.config import ConfigError
from captioning.data.vocab import Vocabulary
from captioning.model.attention import choosing, shared_coins
from captioning.model.decoding import decode
from captioning.model.paper import AttentionDecoder, Draws, HardAttention, SoftAttention, inverse_cdf, sample
from captioning.model.scores import SCORES
from tests.model.sizes import GRID, A, B, D, H, L, V, inputs


def make(kind: str = "hard", score: str = "additive", seed: int = 0, **options):
    torch.manual_seed(seed)
    scorer = SCORES[score](annotation_dim=D, hidden_dim=H, attention_dim=A, grid=GRID)
    return HardAttention(scorer, **options) if kind == "hard" else SoftAttention(scorer, **options)


def formed_with(out) -> torch.Tensor:
    """[B, L], the weights z_t was formed with: one-hot at s_t where a cell was chosen, else alpha_t."""
    if out.location is None:
        return out.alpha
    one_hot = torch.nn.functional.one_hot(out.location.clamp(min=0), out.alpha.shape[1]).to(out.alpha.dtype)
    return torch.where((out.location >= 0)[:, None], one_hot, out.alpha)


@pytest.mark.parametrize("score", ["additive", "dot", "local"])
def test_sampled_weights_are_one_hot_and_pick_the_annotation(score):
    attention = make(score=score, expectation_prob=0.0).train()
    a, h = inputs()
    torch.manual_seed(3)
    with torch.no_grad():
        out = attention(attention.start(a), h)
    assert isinstance(attention, HardAttention)
    assert out.location.shape == (B,) and ((out.location >= 0) & (out.location < L)).all()
    weights = formed_with(out)  # [B, L]
    assert ((weights == 0) | (weights == 1)).all() and (weights.sum(1) == 1).all()  # one-hot
    assert torch.equal(weights.argmax(1), out.location)
    torch.testing.assert_close(out.context, a[torch.arange(B), out.location])  # z_t = a_{s_t}
    torch.testing.assert_close(out.alpha.sum(1), torch.ones(B))  # the map stays a distribution
    torch.testing.assert_close(out.log_prob, out.alpha[torch.arange(B), out.location].log())
    torch.testing.assert_close(out.entropy, -(out.alpha * out.alpha.log()).sum(1))


@pytest.mark.parametrize("score", ["additive", "cosine", "location"])
def test_the_expectation_path_equals_soft_attention(score):
    soft, hard = make("soft", score), make("hard", score, expectation_prob=1.0)
    hard.load_state_dict(soft.state_dict())  # the same weights, and nothing else: no counter of its own
    a, h = inputs()
    with torch.no_grad():
        expected = soft(soft.start(a), h)
        trained = hard.train()(hard.start(a), h)  # coin always says "expectation"
        tested = hard.eval()(hard.start(a), h)  # the default test-time choice
    for out in (trained, tested):
        torch.testing.assert_close(out.context, expected.context)
        torch.testing.assert_close(out.alpha, expected.alpha)
        torch.testing.assert_close(formed_with(out), expected.alpha)
        assert (out.location == -1).all() and (out.log_prob == 0).all()  # nothing sampled, nothing to reinforce


def test_the_coin_is_one_per_image_for_the_whole_caption():
    attention = make(expectation_prob=0.5)
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                               dropout=0.0).train()
    batch = 400
    a, _ = inputs(batch=batch)
    tokens = torch.randint(0, V, (batch, 6), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(5)
    with torch.no_grad():
        out = decoder(a, tokens)
    assert out.log_probs.shape == out.entropies.shape == out.locations.shape == (batch, 6)
    expectation = out.locations[:, 0] == -1  # [batch]
    assert torch.equal(out.locations == -1, expectation[:, None].expand(-1, 6))  # the same every step
    assert (out.log_probs[expectation] == 0).all() and (out.log_probs[~expectation] < 0).all()
    assert 0.4 < expectation.float().mean() < 0.6  # 400 fair coins: 0.5 ± 0.025 (1 sd)
    # one coin per batch, as the authors' code did: every image the same
    decoder.attention = make(expectation_prob=0.5, coin="batch")
    draws = []
    for seed in range(12):
        torch.manual_seed(seed)
        with torch.no_grad():
            rows = decoder(a[:8], tokens[:8]).locations[:, 0] == -1
        assert rows.all() or not rows.any()
        draws.append(bool(rows[0]))
    assert 0 < sum(draws) < 12  # and it does come up both ways


def test_copies_of_a_caption_share_their_image_coin_through_the_length_sort():
    """train.reinforce.location_samples = K puts K copies of each caption in consecutive rows (train_step), whose
    draws share their image's coin (shared_coins): one image, one coin, also when the decoder sorts
    the rows by length and drops finished ones, and for an odd number of images."""
    samples, images = 3, 121
    attention = make(expectation_prob=0.5)
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                               dropout=0.0).train()
    a, _ = inputs(batch=images)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, V, (images, 7), generator=generator)
    lengths = torch.randint(2, 8, (images,), generator=generator)  # captions of mixed length
    uniform = shared_coins(torch.rand(images * samples, 8, generator=generator), group=samples, coin="image")
    draws = Draws.from_uniform(uniform, expectation_prob=0.5)
    with torch.no_grad():
        out = decoder(a.repeat_interleave(samples, 0), tokens.repeat_interleave(samples, 0),
                      lengths=lengths.repeat_interleave(samples), draws=draws)
    expectation = (out.locations[:, 0] == -1).view(images, samples)  # [images, K]
    assert (expectation.all(1) | ~expectation.any(1)).all()  # the K copies agree
    assert 0.3 < expectation[:, 0].float().mean() < 0.7  # 121 fair coins, one per image


def test_a_coin_of_exactly_the_expectations_chance_samples(monkeypatch):
    """The expectation is taken where the coin u < p: with p = 0 (sampling only) even u = 0 samples."""
    attention = make(expectation_prob=0.0).train()
    monkeypatch.setattr(torch, "rand", lambda *size, **options: torch.zeros(*size, **options))
    assert not attention.start(inputs(batch=3)[0]).expectation.any()


def test_shared_coins_give_each_image_its_first_rows_draw_or_the_batch_its_first():
    draws = torch.tensor([[0.1, 0.7], [0.6, 0.8], [0.3, 0.9], [0.9, 0.2], [0.4, 0.5]])  # 5 rows: 2 + 2 + 1
    by_image = shared_coins(draws, group=2, coin="image")
    assert by_image[:, 0].tolist() == pytest.approx([0.1, 0.1, 0.3, 0.3, 0.4])
    assert torch.equal(by_image[:, 1:], draws[:, 1:])  # the cells' draws are each row's own
    by_batch = shared_coins(draws, group=2, coin="batch")
    assert by_batch[:, 0].tolist() == pytest.approx([0.1] * 5) and torch.equal(by_batch[:, 1:], draws[:, 1:])
    assert torch.equal(shared_coins(draws, group=1, coin="image"), draws)


def test_samples_follow_alpha():
    attention = make(expectation_prob=0.0).train()
    a, h = inputs(batch=1)
    count = 20000
    with torch.no_grad():
        memory = attention.start(a.expand(count, L, D))
        torch.manual_seed(11)
        out = attention(memory, h.expand(count, H))
    frequencies = torch.bincount(out.location, minlength=L).float() / count
    alpha = out.alpha[0]
    tolerance = 4 * (alpha * (1 - alpha) / count).sqrt() + 1e-3  # 4 standard errors of a frequency
    assert ((frequencies - alpha).abs() <= tolerance).all(), (frequencies, alpha)


def test_given_draws_pick_cells_with_alphas_probabilities_and_decide_the_coin():
    """Draws handed to `start`: the cell whose cumulative alpha first passes the row's draw (inverse
    CDF: frequencies equal alpha), and the coin from column 0, shared by each image's 2 rows."""
    attention = make(expectation_prob=0.5).train()
    a, h = inputs(batch=1)
    count = 20000
    draws = torch.rand(count, 3, generator=torch.Generator().manual_seed(5))  # [rows, coin + 2 steps]
    draws = shared_coins(draws, group=2, coin="image")
    with torch.no_grad():
        memory = attention.start(a.expand(count, L, D), draws=Draws.from_uniform(draws, expectation_prob=0.5))
        out = attention(memory, h.expand(count, H))
    alpha = out.alpha[0]
    expected = torch.searchsorted(alpha.cumsum(0), draws[:, 1].contiguous(), right=True)  # by hand
    chosen = torch.where(out.location >= 0, out.location, expected)
    assert torch.equal(chosen, expected.clamp(max=L - 1)) and memory.t == 1
    frequencies = torch.bincount(chosen, minlength=L).float() / count
    tolerance = 4 * (alpha * (1 - alpha) / count).sqrt() + 1e-3
    assert ((frequencies - alpha).abs() <= tolerance).all()
    coins = draws[0::2, 0] < 0.5  # each image's first row decides for both of its rows
    assert torch.equal(out.location[0::2] == -1, coins) and torch.equal(out.location[1::2] == -1, coins)


@pytest.mark.parametrize(("coin", "expected"), [("image", [True, False, False, True]),
                                              ("batch", [True, True, True, True])])
def test_given_draws_decide_the_coin_per_image_or_once_for_the_batch(coin, expected):
    """coin "batch": the first row's draw decides for every row; "image": each row's own (group 1).
    The expectation is taken where the draw u < p (u in [0, 1)), so a draw equal to p samples."""
    attention = make(expectation_prob=0.5, coin=coin).train()
    a, _ = inputs(batch=4)
    draws = torch.tensor([[0.2, 0.5], [0.5, 0.5], [0.9, 0.5], [0.49, 0.5]])  # [rows, coin + 1 step]
    shared = shared_coins(draws, group=1, coin=coin)
    memory = attention.start(a, draws=Draws.from_uniform(shared, expectation_prob=0.5))
    assert memory.expectation.tolist() == expected


def test_each_step_takes_its_own_column_of_draws_and_a_draw_past_the_last_boundary_takes_the_last_cell():
    """Column t + 1 decides step t (the cell whose cumulative alpha first reaches the draw); a draw
    beyond the sum of alpha (rounding can leave it below 1) takes the last cell, not a cell past it."""
    attention = make(expectation_prob=0.0).train()
    a, h = inputs(batch=1)
    draws = torch.tensor([[0.9, 1e-6, 0.999999, 0.5, 2.0]])  # [1, coin + 4 steps]
    with torch.no_grad():
        memory = attention.start(a, draws=Draws.from_uniform(draws, expectation_prob=0.0))
        cells = [int(attention(memory, h).location) for _ in range(4)]
        alpha = attention(attention.start(a), h).alpha[0]  # the same map at every step (same h)
    cumulative = alpha.cumsum(0)
    middle = int((cumulative < 0.5).sum())  # by hand: how many cells the draw passes
    assert cells == [0, L - 1, middle, L - 1] and memory.t == 4


def test_given_draws_give_a_caption_the_same_samples_in_any_batch_order_or_split():
    """What lets processes that each hold part of a batch train as one process: with each row's draws
    given, a caption's samples depend on its own draws only, not on the other rows, their order, or
    the decoder's sort by length."""
    decoder = AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H,
                               attention=make(expectation_prob=0.3), dropout=0.0).train()
    rows = 8
    a, _ = inputs(batch=rows)
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(4, V, (rows, 7), generator=generator)
    lengths = torch.randint(2, 8, (rows,), generator=generator)
    uniform = torch.rand(rows, 8, generator=generator)

    def draws(part) -> Draws:
        return Draws.from_uniform(uniform[part], expectation_prob=0.3)

    with torch.no_grad():
        whole = decoder(a, tokens, lengths=lengths, draws=draws(slice(None)))
        order = torch.randperm(rows, generator=generator)
        shuffled = decoder(a[order], tokens[order], lengths=lengths[order], draws=draws(order))
        halves = [decoder(a[part], tokens[part], lengths=lengths[part], draws=draws(part))
                  for part in (slice(0, 3), slice(3, rows))]
    assert (whole.locations >= 0).any() and (whole.locations[:, 0] == -1).any()  # both kinds of rows
    assert torch.equal(shuffled.locations, whole.locations[order])
    assert torch.equal(torch.cat([h.locations for h in halves]), whole.locations)
    torch.testing.assert_close(torch.cat([h.log_probs for h in halves]), whole.log_probs)


def test_test_time_choices_and_the_context_manager():
    attention = make().eval()
    a, h = inputs()
    with torch.no_grad():
        memory = attention.start(a)
        assert memory.expectation is None  # no coin outside training
        with choosing(attention, "argmax"):
            argmax = attention(memory, h)
        assert attention.choice == "expectation"  # restored
        with choosing(attention, "sample"):
            torch.manual_seed(0)
            sampled = [attention(memory, h).location for _ in range(30)]
    assert torch.equal(argmax.location, argmax.alpha.argmax(1))
    torch.testing.assert_close(argmax.context, a[torch.arange(B), argmax.location])
    assert len({tuple(s.tolist()) for s in sampled}) > 1  # sampling at test time does vary
    with pytest.raises(ValueError, match="soft attention"), choosing(make("soft"), "argmax"):
        pass
    with choosing(make("soft"), "expectation"):  # soft attention is the expectation: fine
        pass
    with pytest.raises(ValueError, match="decode.hard_choice 'mode' is not one of expectation, argmax, sample"), \
            choosing(attention, "mode"):
        pass


def test_hard_attentions_map_is_soft_attentions_at_the_same_temperature():
    """The map hard attention samples from is the soft map, softmax(e / temperature) (extras.temperature)."""
    a, h = inputs()
    for temperature in (1.0, 2.5):
        soft, hard = make("soft", temperature=temperature), make("hard", temperature=temperature).eval()
        with torch.no_grad():
            torch.testing.assert_close(hard(hard.start(a), h).alpha, soft(soft.start(a), h).alpha)
    with torch.no_grad():
        assert not torch.allclose(hard(hard.start(a), h).alpha, make("soft")(soft.start(a), h).alpha)


def hard_decoder(seed: int = 0) -> AttentionDecoder:
    attention = make(seed=seed)
    return AttentionDecoder(vocab_size=V, annotation_dim=D, embed_dim=8, hidden_dim=H, attention=attention,
                            dropout=0.0).eval()


@pytest.mark.parametrize("beam_size", [1, 3])
def test_decoding_returns_the_chosen_cells(beam_size):
    decoder = hard_decoder()
    a, _ = inputs()
    expectation = decode(decoder, a, beam_size=beam_size, max_length=6)
    argmax = decode(decoder, a, beam_size=beam_size, max_length=6, hard_choice="argmax")
    assert (expectation.locations == -1).all()
    steps = argmax.tokens.shape[1]
    assert argmax.locations.shape == (B, steps)
    assert torch.equal(argmax.locations, argmax.alphas.argmax(2))  # argmax: the map's peak, word by word
    assert decoder.attention.choice == "expectation"  # decode leaves the model as it was


def test_argmax_decoding_beam_one_equals_greedy_and_teacher_forcing():
    decoder = hard_decoder(seed=2)
    a, _ = inputs(seed=4)
    greedy = decode(decoder, a, beam_size=1, max_length=6, hard_choice="argmax")
    beam = decode(decoder, a, beam_size=1, max_length=6, hard_choice="argmax")
    assert torch.equal(greedy.tokens, beam.tokens) and torch.equal(greedy.locations, beam.locations)
    # Greedy fed <start> then its own words (<pad> after <end>): teacher forcing on them replays it.
    start = torch.full((B, 1), Vocabulary.start_id, dtype=torch.long)
    with choosing(decoder, "argmax"), torch.no_grad():
        forced = decoder(a, torch.cat([start, greedy.tokens[:, :-1]], dim=1))
    torch.testing.assert_close(forced.alphas, greedy.alphas)
    assert torch.equal(forced.locations, greedy.locations)


def test_without_draws_each_image_flips_its_own_coin_at_the_papers_chance():
    """The module holds no schedule: unless a training step hands coins in, `start` flips one per
    row at expectation_prob (by default the paper's 0.5), and none outside training."""
    attention = make().train()  # the defaults
    a, _ = inputs(batch=400)
    torch.manual_seed(0)
    share = float(attention.start(a).expectation.float().mean())
    assert 0.42 < share < 0.58
    for _ in range(50):
        attention.start(a[:1])
    later = float(attention.start(a).expectation.float().mean())
    assert 0.42 < later < 0.58  # no counter of its own: the 52nd call flips at the chance of the first
    assert attention.eval().start(a).expectation is None


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_validation_decodes_hard_attention_as_the_config_says(kind):
    """The best checkpoint is picked by the decoding it will be used with (decode.hard_choice): with
    the captions of that decoding as the references, validation scores perfectly, and the captions of
    the other choice (which differ here) would not."""
    import numpy as np

    from captioning.config import load_config
    from captioning.eval.evaluate import decode_split, score_split
    from captioning.model.encoder_decoder import build_decoder
    from captioning.train import validation

    choice = ["decode.hard_choice=argmax"] if kind == "hard" else []  # soft attention is the expectation
    config = load_config("configs/shapes_soft.yaml", [f"model.attention={kind}", *choice, "model.embed_dim=8",
                                                      "model.hidden_dim=16", "model.attention_dim=8"])
    torch.manual_seed(3)
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=GRID).eval()
    with torch.no_grad():
        decoder.out.weight.mul_(4.0)  # captions that depend on the maps
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", *(f"w{i}" for i in range(V - 4))])
    images = 12
    annotations = torch.randn(images, L, D, generator=torch.Generator().manual_seed(1)).half().numpy()

    def captions(hard_choice):
        return decode_split(decoder, annotations, image_ids=list(range(images)), vocab=vocab, grid=GRID,
                            max_length=config.decode.max_length, hard_choice=hard_choice).results

    wanted = captions("argmax" if kind == "hard" else None)

    class Split:  # what validate reads of a split (no object boxes or instances: no scorer)
        records, image_ids, references, grid = [0] * images, list(range(images)), [[r["caption"]] for r in wanted], GRID
        scenes = instances = None

    Split.annotations = np.asarray(annotations)
    metrics = validation.validation_metrics(decoder, Split(), vocab, config, device="cpu")
    assert metrics == score_split(wanted, image_ids=Split.image_ids, references=Split.references, full=False)
    assert metrics["Bleu_4"] > 0.99
    if kind == "hard":
        other = captions("expectation")
        assert other != wanted
        assert score_split(other, image_ids=Split.image_ids, references=Split.references, full=False) != metrics
    with pytest.raises(ConfigError, match="decode.hard_choice=argmax applies to hard attention only"):
        load_config("configs/shapes_soft.yaml", ["decode.hard_choice=argmax"])


def test_inverse_cdf_never_picks_a_cell_of_probability_zero():
    """A draw of exactly 0 takes the first cell with probability, not a zero cell before it (a
    cumulative sum that starts at 0 equals the draw there); a draw at or past the total (rounding)
    takes the last cell with probability, not zero cells after it; in between, the cell whose
    cumulative probability first exceeds the draw."""
    alpha = torch.tensor([[0.0, 0.0, 0.25, 0.0, 0.75, 0.0]] * 5)
    draws = torch.tensor([0.0, 0.2499, 0.25, 0.9999, 1.0])
    assert inverse_cdf(alpha, draws).tolist() == [2, 2, 4, 4, 4]
    # rounding: the cumulative sum stops short of the draw; each row's own last cell with probability
    short = torch.tensor([[0.3, 0.3, 0.3999, 0.0], [0.5, 0.4999, 0.0, 0.0], [0.2, 0.2, 0.2, 0.3999]])
    assert inverse_cdf(short, torch.tensor([0.99995, 0.99995, 0.99995])).tolist() == [2, 1, 3]


def test_sampling_a_row_that_is_not_a_distribution_does_not_stop_the_run():
    """torch.multinomial raises on NaN, inf or an all-zero row; `sample` draws such a row uniformly
    (its loss, not finite, is what skips the step) and the other rows from their own distribution."""
    probabilities = torch.tensor([[0.0, 1.0, 0.0], [float("nan"), 0.5, 0.5], [0.0, 0.0, 0.0],
                                  [float("inf"), 0.0, 0.0], [0.0, 0.0, 1.0]])
    torch.manual_seed(0)
    drawn = torch.stack([sample(probabilities) for _ in range(300)])  # [300, 5]
    assert (drawn[:, 0] == 1).all() and (drawn[:, 4] == 2).all()
    for row in (1, 2, 3):
        assert set(drawn[:, row].tolist()) == {0, 1, 2}
