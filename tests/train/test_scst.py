"""Self-critical sequence training: the samples, the baselines, the direction of the gradient, a run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.config import ConfigError
from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.model.encoder_decoder import build_decoder
from captioning.train.loop import fit
from captioning.train.scst import ImageRows, ScstConfig, SelfCritical, image_batches
from tests.model.sizes import model_section

WORDS = ["a", "red", "green", "square", "circle"]


def handed_coins(monkeypatch, decoder: torch.nn.Module) -> list[torch.Tensor]:
    """The coins each `start` of hard attention is handed (True: that row uses the expectation).
    Sampling returns no locations to read them from, so they are read where they are made."""
    seen, start = [], decoder.attention.start

    def spy(annotations, draws=None):
        memory = start(annotations, draws=draws)
        seen.append(memory.expectation)
        return memory

    monkeypatch.setattr(decoder.attention, "start", spy)
    return seen


def _decoder(*overrides: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = model_section("embed_dim=8", "hidden_dim=16", *overrides)
    return build_decoder(model, vocab_size=len(SPECIALS) + len(WORDS), annotation_dim=6, grid=(2, 2))


def _critic(samples: int = 4, baseline: str = "leave_one_out") -> SelfCritical:
    references = [[["a", "red", "square"], ["a", "square"]], [["a", "green", "circle"]]]
    return SelfCritical(ScstConfig(samples=samples, baseline=baseline), references=references,
                        vocab=Vocabulary([*SPECIALS, *WORDS]), max_length=6)


def test_samples_stop_at_end_and_carry_gradients() -> None:
    decoder, critic = _decoder().train(), _critic()
    annotations = torch.randn(2, 4, 6)
    tokens, log_probs, _ = critic.sample(decoder, annotations)
    assert tokens.shape[0] == 2 * 4 and log_probs.shape == tokens.shape
    for row, logs in zip(tokens.tolist(), log_probs.detach()):
        if Vocabulary.end_id in row:
            end = row.index(Vocabulary.end_id)
            assert all(t == Vocabulary.pad_id for t in row[end + 1:])
            assert (logs[end + 1:] == 0).all() and (logs[: end + 1] < 0).all()
    log_probs.sum().backward()
    assert decoder.embed.weight.grad is not None and decoder.out.weight.grad.abs().sum() > 0


def _advantages(critic: SelfCritical, decoder, rewards: np.ndarray, monkeypatch) -> np.ndarray:
    """The advantage each sample's log-probability is scaled by: one step per sample, so that the
    loss's gradient with respect to that step's log-probability is -advantage / samples."""
    rows = len(rewards)
    log_probs = torch.zeros(rows, 1, requires_grad=True)
    tokens = torch.full((rows, 1), Vocabulary.end_id)
    alphas = torch.full((rows, 1, 4), 0.25)  # [N, T, L]: no term reads them here
    monkeypatch.setattr(critic, "sample", lambda decoder, annotations, draws=None: (tokens, log_probs, alphas))
    monkeypatch.setattr(critic, "rewards", lambda tokens, images: rewards if len(images) == rows
                        else np.array([2.0, 1.0]))  # the greedy captions' rewards, per image
    loss, _ = critic.surrogate(decoder, ImageRows(torch.tensor([0, 1]), torch.randn(2, 4, 6)))
    loss.backward()
    return -(log_probs.grad[:, 0] * rows).numpy()


def test_each_baseline_gives_the_advantages_of_its_paper(monkeypatch) -> None:
    rewards = np.array([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])  # 2 images x 3 samples
    decoder = _decoder().train()
    mean = _advantages(_critic(samples=3, baseline="leave_one_out"), decoder, rewards, monkeypatch)
    np.testing.assert_allclose(mean, [1 - 4, 2 - 3.5, 6 - 1.5, 0 - 1.5, 0 - 1.5, 3 - 0], atol=1e-6)  # Luo, 2020
    greedy = _advantages(_critic(samples=3, baseline="greedy"), decoder, rewards, monkeypatch)
    np.testing.assert_allclose(greedy, [1 - 2, 2 - 2, 6 - 2, 0 - 1, 0 - 1, 3 - 1], atol=1e-6)  # Rennie et al.


def test_equal_rewards_give_no_gradient(monkeypatch) -> None:
    decoder, critic = _decoder().train(), _critic(samples=3)
    monkeypatch.setattr(critic, "rewards", lambda tokens, images: np.full(len(images), 0.7))
    loss, _ = critic.surrogate(decoder, ImageRows(torch.tensor([0, 1]), torch.randn(2, 4, 6)))
    assert abs(loss.item()) < 1e-9


@pytest.mark.parametrize("baseline", ["leave_one_out", "greedy"])
def test_the_gradient_moves_towards_the_rewarded_word(baseline: str, monkeypatch) -> None:
    """Reward = 1 when the caption starts with "red": a few steps must make it likelier, whichever baseline."""
    decoder, critic = _decoder(), _critic(samples=8, baseline=baseline)
    red = 4 + WORDS.index("red")
    monkeypatch.setattr(critic, "rewards", lambda tokens, images: (tokens[:, 0] == red).double().numpy())
    annotations = torch.randn(2, 4, 6)

    def p_red() -> float:
        decoder.eval()
        with torch.no_grad():
            memory, state = decoder.start(annotations)
            logits, _, _ = decoder.next_word(memory, state, torch.full((2,), Vocabulary.start_id))
        return torch.softmax(logits, 1)[:, red].mean().item()

    before = p_red()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=0.05)
    torch.manual_seed(1)
    for step in range(15):
        critic.step(decoder, ImageRows(torch.tensor([0, 1]), annotations), optimizer, grad_clip=5.0, step=step)
    assert p_red() > before + 0.2


def test_hard_attention_adds_the_sampled_cells_log_probability() -> None:
    """With every word equally likely (a zero output layer), whatever log-probability a step carries
    beyond log(1/V) is the sampled cell's log alpha: present, and a log-probability (<= 0)."""
    decoder, critic = _decoder("attention=hard", "hard.expectation_prob=0.0").train(), _critic(samples=2)
    with torch.no_grad():
        decoder.out.weight.zero_()
        decoder.out.bias.zero_()
    tokens, log_probs, _ = critic.sample(decoder, torch.randn(2, 4, 6))
    cells = (log_probs.detach() + math.log(len(WORDS) + 4))[:, 0]  # the first step: never after <end>
    assert (cells <= 1e-6).all() and (cells < -1e-3).any()


def test_samples_never_hold_pad_or_start() -> None:
    """A sampled <pad> would leave the loss (the steps counted are the non-<pad> ones) while its
    caption went on; <start> is never a word. Both are made impossible, and the log-probabilities
    are of the distribution the words were drawn from (normalized without them)."""
    decoder, critic = _decoder().train(), _critic(samples=64)
    with torch.no_grad():  # every word equally likely, <pad> and <start> too, if they were allowed
        decoder.out.weight.zero_()
        decoder.out.bias.zero_()
    torch.manual_seed(0)
    tokens, log_probs, _ = critic.sample(decoder, torch.randn(2, 4, 6))
    running = torch.ones_like(tokens, dtype=torch.bool)
    running[:, 1:] = (tokens[:, :-1] != Vocabulary.end_id).cumprod(dim=1).bool()  # the steps before <end>, and it
    assert not (tokens[running] == Vocabulary.pad_id).any() and not (tokens == Vocabulary.start_id).any()
    allowed = len(SPECIALS) + len(WORDS) - 2
    torch.testing.assert_close(log_probs.detach()[running], torch.full_like(log_probs[running], -math.log(allowed)))


def test_a_step_whose_distribution_is_not_finite_is_skipped_not_a_crash() -> None:
    """NaN logits (an fp16 overflow, a bad batch) reach torch.multinomial as a NaN distribution,
    which raises; the step must be skipped like any other whose loss is not finite."""
    decoder, critic = _decoder().train(), _critic(samples=2)
    before = {name: value.clone() for name, value in decoder.state_dict().items()}
    annotations = torch.randn(2, 4, 6)
    annotations[0] = float("nan")
    optimizer = torch.optim.SGD(decoder.parameters(), lr=0.1)
    losses = critic.step(decoder, ImageRows(torch.tensor([0, 1]), annotations), optimizer, grad_clip=5.0, step=0)
    assert losses.skipped
    assert all(torch.equal(value, before[name]) for name, value in decoder.state_dict().items())


@pytest.mark.parametrize("images", [3, 4])
def test_hard_attention_flips_one_coin_per_image_whatever_reinforce_samples_says(images: int) -> None:
    """The coin is flipped for each image before its K samples are made (SelfCritical.sample), so the
    K samples of an image share it: an odd number of images is fine, and train.reinforce.location_samples (the
    cross-entropy objective's setting) has nothing to do with it."""
    from captioning.config import load_config

    config = load_config(None, ["model.attention=hard", "train.reinforce.location_samples=2"])
    torch.manual_seed(0)
    decoder = build_decoder(config.model, vocab_size=len(SPECIALS) + len(WORDS), annotation_dim=6,
                            grid=(2, 2)).train()
    critic = _critic(samples=3)
    coins = []
    for seed in range(20):
        torch.manual_seed(seed)
        expectation = []
        original = decoder.attention.forward

        def forward(memory, query, original=original, expectation=expectation):
            expectation.append(memory.expectation.clone())
            return original(memory, query)

        decoder.attention.forward = forward
        critic.sample(decoder, torch.randn(images, 4, 6))
        del decoder.attention.forward
        first = expectation[0].view(images, 3)  # [images, K]
        assert (first == first[:, :1]).all()  # an image's samples share its coin
        coins.append(first[:, 0])
    coins = torch.cat(coins).float()
    assert 0.3 < float(coins.mean()) < 0.7  # fair coins, one per image


def test_the_greedy_baseline_decodes_hard_attention_as_test_time_does(monkeypatch) -> None:
    """decode.hard_choice (argmax, sample) applies to the greedy caption the samples are compared
    with, as it does to validation and evaluation: the baseline is the reward of the caption that
    test-time decoding gives (a reward read off the tokens here, so that every caption has its own)."""
    from captioning.model.attention import choosing
    from captioning.model.decoding import greedy

    decoder, critic = _decoder("attention=hard").train(), _critic(samples=2, baseline="greedy")
    monkeypatch.setattr(critic, "rewards", lambda tokens, images: (tokens * torch.arange(tokens.shape[1])).sum(1)
                        .double().numpy())
    images = torch.arange(8) % 2
    batch = ImageRows(images, torch.randn(8, 4, 6, generator=torch.Generator().manual_seed(2)))

    def test_time(choice):
        decoder.eval()
        with choosing(decoder, choice):
            caption = greedy(decoder, batch.annotations, max_length=critic.max_length)
        decoder.train()
        return float(critic.rewards(caption.tokens, images.tolist()).mean())

    expected = {choice: test_time(choice) for choice in ("argmax", None)}
    assert expected["argmax"] != expected[None]  # the two decodings differ here
    for choice in ("argmax", None, "argmax"):
        _, stats = critic.surrogate(decoder, batch, hard_choice=choice)
        assert stats["baseline"] == expected[choice], choice
    assert test_time(None) == expected[None]  # the model's own choice is back after the loss


def test_image_batches_cover_every_image_once_per_epoch_in_a_seeded_order() -> None:
    first = image_batches(10, batch_size=4, seed=3, epoch=0)
    assert sorted(i for batch in first for i in batch) == list(range(10)) and [len(b) for b in first] == [4, 4, 2]
    assert first == image_batches(10, batch_size=4, seed=3, epoch=0)
    assert first != image_batches(10, batch_size=4, seed=3, epoch=1)


@pytest.mark.parametrize(("overrides", "said"), [
    (["train.scst.baseline=leave_one_out", "train.scst.samples=1"], "needs train.scst.samples >= 2"),
    (["encoder.fine_tune_from=block6"], "nor with encoder.fine_tune_from without encoder.cache_frozen"),
    (["data.feature_cache=false"], "not with data.feature_cache=false"),
    (["data.mirror=true"], "data.mirror=false"),
])
def test_configs_scst_cannot_run_are_refused_at_load(overrides: list[str], said: str) -> None:
    from captioning.config import load_config

    with pytest.raises(ConfigError, match=said):
        load_config(None, ["train.objective=scst", *overrides])


def test_a_self_critical_run_from_a_cross_entropy_checkpoint(tiny_run, tiny_config, tmp_path: Path) -> None:
    config = tiny_config(tmp_path, f"train.init_from={tiny_run.checkpoint}", "train.objective=scst",
                         "train.max_steps=4", "train.log_every_steps=1", "train.scst.samples=3")
    summary = fit(config)
    assert summary["steps"] == 4
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    steps = [e for e in logged if "reward" in e]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    assert all(0.0 <= e["ended"] <= 1.0 and math.isfinite(e["loss"]) and e["reward"] >= 0 for e in steps)
    payload = torch.load(tmp_path / "last.pt", map_location="cpu", weights_only=True)
    assert payload["config"]["train"]["objective"] == "scst"


def test_a_self_critical_run_from_a_fine_tuned_checkpoint_trains_its_decoder_over_its_own_encoder(
        tiny_config, tmp_path: Path) -> None:
    """From a run that fine-tuned block4 on block3's cache: self-critical steps read that cache, run
    the fine-tuned block4 on it (the decoder reads 112 channels, the cache holds 80), and leave the
    encoder as the warm start left it while the decoder moves."""
    from captioning.config import load_config

    tuned = ("encoder.fine_tune_from=block4", "encoder.cache_frozen=true")
    load_config(None, ["train.objective=scst", *tuned])  # accepted: the frozen stages are cached
    fit(tiny_config(tmp_path / "xe", *tuned, "train.max_steps=3", "train.val_images=4"))
    start = torch.load(tmp_path / "xe" / "last.pt", map_location="cpu", weights_only=True)
    config = tiny_config(tmp_path / "scst", *tuned, f"train.init_from={tmp_path / 'xe' / 'last.pt'}",
                         "train.objective=scst", "train.max_steps=3", "train.log_every_steps=1",
                         "train.scst.samples=2", "train.val_images=4", "train.lr=0.01")
    assert fit(config)["steps"] == 3
    logged = [json.loads(line) for line in (tmp_path / "scst" / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in logged if "reward" in e] == [1, 2, 3]
    end = torch.load(tmp_path / "scst" / "last.pt", map_location="cpu", weights_only=True)
    assert all(torch.equal(end["encoder"][key], value) for key, value in start["encoder"].items())
    assert not all(torch.equal(end["decoder"][key], value) for key, value in start["decoder"].items())


@pytest.mark.parametrize(("name", "start"), [("shapes_scst", "shapes_soft"), ("coco_vgg19_scst", "coco_vgg19_soft")])
def test_the_scst_configs_start_from_their_cross_entropy_runs_best(name: str, start: str) -> None:
    from captioning.config import load_config
    from tests.tiny import REPO

    scst, xe = load_config(REPO / "configs" / f"{name}.yaml"), load_config(REPO / "configs" / f"{start}.yaml")
    assert scst.train.objective == "scst" and xe.train.objective == "xe"
    assert scst.train.init_from == f"{xe.train.out_dir}/best.pt" and scst.train.out_dir != xe.train.out_dir
    assert scst.model == xe.model and scst.encoder == xe.encoder and scst.data == xe.data


def test_a_self_critical_run_with_hard_attention_and_an_odd_batch_of_images(tiny_run, tiny_config,
                                                                            tmp_path: Path) -> None:
    """A self-critical run's coins are one per image, so a batch of 3 images trains. train.reinforce
    (location_samples, its baseline, its entropy term) belongs to the cross-entropy objective: a
    self-critical run would take it and ignore it, so it is refused by name."""
    overrides = [f"train.init_from={tiny_run.checkpoint}", "train.objective=scst", "train.max_steps=3",
                 "train.scst.samples=2", "train.batch_size=3", "model.attention=hard", "decode.hard_choice=argmax"]
    assert fit(tiny_config(tmp_path, *overrides))["steps"] == 3
    for setting in ("train.reinforce.location_samples=2", "train.reinforce.entropy_weight=0.1"):
        with pytest.raises(ConfigError, match="train.reinforce applies only with model.attention=hard and "
                                              "train.objective=xe, not train.objective=scst"):
            tiny_config(tmp_path, *overrides, setting)


@pytest.mark.parametrize(("step", "low", "high"), [(0, 1.0, 1.0), (9, 0.35, 0.65)])
def test_self_critical_steps_flip_each_images_coin_at_the_chance_of_the_runs_step(step, low, high,
                                                                                monkeypatch) -> None:
    """Hard attention under SCST warms up as under cross-entropy (model.hard.warmup): the step hands
    `start` one coin per image at expectation_prob_at(step), which the image's K samples share."""
    decoder, critic = _decoder("attention=hard", "hard.expectation_prob=0.5"), _critic(samples=2)
    seen = handed_coins(monkeypatch, decoder)
    monkeypatch.setattr(critic, "rewards", lambda tokens, images: np.zeros(len(images)))
    optimizer = torch.optim.SGD(decoder.parameters(), lr=0.0)
    torch.manual_seed(0)
    critic.step(decoder, ImageRows(torch.arange(200) % 2, torch.randn(200, 4, 6)), optimizer, grad_clip=1.0,
                step=step, hard_warmup=4)
    coins = seen[0]  # the samples' forward; the greedy baseline's is in eval mode
    assert coins.shape == (200,) and low <= float(coins.float().mean()) <= high


def test_a_warm_start_under_other_model_settings_says_which(tiny_run, tiny_config, tmp_path: Path, capsys) -> None:
    """The weights load whatever the dropout (no shape depends on it), so a run started from a model
    trained with another one would train silently under another model; it is told, in one line."""
    from captioning.train.warm_start import model_differences

    trained = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    dropout = trained["config"]["model"]["dropout"]
    other = 0.1 if dropout != 0.1 else 0.2
    same = tiny_config(tmp_path / "same", f"train.init_from={tiny_run.checkpoint}")
    assert model_differences(same, trained, tiny_run.checkpoint) == []
    config = tiny_config(tmp_path / "other", f"train.init_from={tiny_run.checkpoint}", "train.objective=scst",
                         "train.max_steps=1", "train.scst.samples=2", f"model.dropout={other}")
    assert model_differences(config, trained, tiny_run.checkpoint) == [f"model.dropout: {dropout!r} -> {other!r}"]
    fit(config)
    err = capsys.readouterr().err
    assert f"this run's model settings differ from the checkpoint's (model.dropout: {dropout!r} -> {other!r})" in err
