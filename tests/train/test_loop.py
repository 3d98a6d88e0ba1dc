"""Training: checkpoint contents, exact resume, overfitting one batch, non-finite losses, atomic saves."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

import captioning.checkpoint as checkpoint_module
import captioning.train.loop
import captioning.train.paper_objective as cross_entropy
import captioning.train.paper_objective as training_objective
from captioning.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from captioning.cli import train_main
from captioning.config import ConfigError, HardConfig, ModelConfig, from_dict
from captioning.data.dataset import Batch
from captioning.data.formats.karpathy import read_split
from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.model.encoder_decoder import build_decoder
from captioning.train.extras.word_weights import word_weight_vector
from captioning.train.loop import fit
from captioning.train.objective import TrainingError
from captioning.train.paper_objective import train_step
from tests.tiny import TINY


@pytest.fixture(scope="module")
def batches_per_epoch(shapes_root: Path, tiny_config, tmp_path_factory: pytest.TempPathFactory) -> int:
    config = tiny_config(tmp_path_factory.mktemp("unused"))
    pairs = sum(len(r.captions) for r in read_split(shapes_root / config.data.split_file, "train"))
    batches = math.ceil(pairs / config.train.batch_size)
    assert batches == 8  # 24 images x 5 captions in batches of 16: the interruptions below rely on it
    return batches


# checkpoints of a real run -------------------------------------------------------------------------


def test_checkpoint_holds_everything_and_loads_without_code(tiny_run, batches_per_epoch: int) -> None:
    for path in (tiny_run.last, tiny_run.checkpoint):
        payload = torch.load(path, map_location="cpu", weights_only=True)
        for key in ("config", "vocab", "decoder", "optimizer", "scheduler", "progress", "rng", "grid",
                    "annotation_dim"):
            assert key in payload, key
    payload = torch.load(tiny_run.last, map_location="cpu", weights_only=True)
    assert payload["progress"]["step"] == tiny_run.steps
    assert payload["progress"]["epoch"] == tiny_run.steps // batches_per_epoch
    assert payload["progress"]["batch_in_epoch"] == tiny_run.steps % batches_per_epoch
    assert payload["progress"]["history"] and math.isfinite(payload["progress"]["best_metric"])
    assert tuple(payload["vocab"][:4]) == SPECIALS and "circle" in payload["vocab"]
    assert payload["grid"] == [6, 6] and payload["annotation_dim"] == 112
    assert payload["config"]["train"]["max_steps"] == tiny_run.steps
    assert payload["optimizer"]["state"]  # Adam moments, not just hyper-parameters
    assert isinstance(payload["rng"]["torch"], torch.Tensor)
    assert "python" in payload["rng"]
    assert "best" in payload["scheduler"] or payload["scheduler"]
    config = from_dict(payload["config"])
    decoder = build_decoder(config.model, vocab_size=len(payload["vocab"]), annotation_dim=payload["annotation_dim"])
    decoder.load_state_dict(payload["decoder"])  # strict: every tensor there, with the right shape
    assert load_checkpoint(tiny_run.last)["progress"]["step"] == tiny_run.steps


# exact resume --------------------------------------------------------------------------------------


def _state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.parametrize(("interrupt", "extra"), [(5, ()), (8, ()), (5, ("data.mirror=true",)),
                                                  (5, ("train.ema_decay=0.9",))],
                         ids=["mid-epoch", "epoch-end", "mirrored-mid-epoch", "averaged-mid-epoch"])
def test_resume_continues_exactly(tmp_path: Path, tiny_config, batches_per_epoch: int, interrupt: int,
                                  extra: tuple[str, ...]) -> None:
    """Run A trains 2N steps straight; run B trains N, stops, and resumes to 2N: same weights.

    Both evaluate (and so step the LR scheduler) at the same steps: every N steps mid-epoch, at
    each epoch's end and at the end. Dropout stays on, so the RNG state must be restored too; with
    data.mirror, so must the coins that mirror the pairs of the interrupted epoch and the next.
    """
    total = 2 * interrupt
    evaluate = f"train.eval_every_steps={interrupt}"
    config_a = tiny_config(tmp_path / "a", f"train.max_steps={total}", evaluate, *extra)
    assert config_a.model.dropout > 0
    fit(config_a)

    torch.manual_seed(1234)  # whatever the global RNG was doing before must not matter
    fit(tiny_config(tmp_path / "b", f"train.max_steps={interrupt}", evaluate, *extra))
    stopped = _state(tmp_path / "b" / "last.pt")["progress"]
    assert stopped["step"] == interrupt
    if interrupt % batches_per_epoch:  # really inside an epoch: the rest of it is still to do
        assert (stopped["epoch"], stopped["batch_in_epoch"]) == (0, interrupt)
    else:
        assert (stopped["epoch"], stopped["batch_in_epoch"]) == (1, 0)
    torch.manual_seed(999)
    fit(tiny_config(tmp_path / "b", f"train.max_steps={total}", evaluate, *extra), resume=True)

    a, b = _state(tmp_path / "a" / "last.pt"), _state(tmp_path / "b" / "last.pt")
    assert a["progress"]["step"] == b["progress"]["step"] == total
    assert a["progress"]["epoch"] == b["progress"]["epoch"] >= 1  # the run crossed an epoch boundary
    weights = ("decoder", "training_decoder") if "training_decoder" in a else ("decoder",)  # the average too
    for key in weights:
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), (key, name)
    for key, moments in a["optimizer"]["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, b["optimizer"]["state"][key][name]), (key, name)
    assert a["scheduler"] == b["scheduler"]
    # The same evaluations at the same steps with the same results (repr, so that nan == nan).
    assert ([repr({k: v for k, v in h.items() if k != "seconds"}) for h in a["progress"]["history"]]
            == [repr({k: v for k, v in h.items() if k != "seconds"}) for h in b["progress"]["history"]])


def test_a_new_run_in_a_used_folder_trains_on_its_own_vocabulary(tmp_path: Path, tiny_config, capsys) -> None:
    """vocab.json, there from an earlier run in the same train.out_dir, was taken as it was: a run with
    another data.min_word_count trained on the earlier vocabulary under a config that said otherwise.
    The one `prepare` wrote for this config is the same words, kept without a word. (A folder that
    holds checkpoints is refused to a new run; one killed before its first save holds vocab.json alone.)"""
    out = tmp_path / "run"

    def killed_before_its_first_save() -> None:
        for name in ("last.pt", "best.pt"):
            (out / name).unlink()

    fit(tiny_config(out, "train.max_steps=1"))
    killed_before_its_first_save()
    before = json.loads((out / "vocab.json").read_text())
    capsys.readouterr()
    fit(tiny_config(out, "train.max_steps=1", "data.min_word_count=1000"))
    after = json.loads((out / "vocab.json").read_text())
    assert len(after) < len(before) and load_checkpoint(out / "last.pt")["vocab"] == after
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"note: {out / 'vocab.json'} held another vocabulary ({len(before)} words) than this run's training "
        f"captions give with data.min_word_count=1000 ({len(after)} words): written anew")
    killed_before_its_first_save()
    fit(tiny_config(out, "train.max_steps=1", "data.min_word_count=1000"))
    assert "vocabulary" not in capsys.readouterr().err


def test_a_new_run_into_a_folder_that_holds_a_run_is_refused_and_leaves_it_as_it_was(tmp_path: Path, tiny_config,
                                                                                  shapes_root: Path, capsys) -> None:
    """A job started again without --resume replaced best.pt at its first validation (the first best
    is any number) and emptied log.jsonl: the run it was to go on with, lost, and exit 0."""
    out = tmp_path / "run"
    fit(tiny_config(out, "train.max_steps=8"))
    kept = {name: (out / name).read_bytes() for name in ("last.pt", "best.pt", "log.jsonl", "vocab.json")}
    said = (f"{out}: holds a run (last.pt and best.pt) that a new run would replace: go on with it with --resume, "
            "or start again in another train.out_dir (or remove this one)")
    with pytest.raises(TrainingError, match=f"^{re.escape(said)}$"):
        fit(tiny_config(out, "train.max_steps=2"))
    capsys.readouterr()
    assert train_main(["--device", "cpu", f"data.root={shapes_root}", *TINY, f"train.out_dir={out}"]) == 2
    assert capsys.readouterr().err == f"error: {said}\n"
    assert {name: (out / name).read_bytes() for name in kept} == kept
    (out / "last.pt").unlink()  # best.pt alone is a run's too
    with pytest.raises(TrainingError, match=re.escape(f"{out}: holds a run (best.pt) that a new run would replace: it "
                                                      "has no last.pt to resume from: start again in another")):
        fit(tiny_config(out, "train.max_steps=2"))
    assert fit(tiny_config(tmp_path / "other", "train.max_steps=2"))["steps"] == 2


def test_a_resumed_run_counts_the_seconds_trained_before_it(tmp_path: Path, tiny_config) -> None:
    """The history's seconds go on from the checkpoint's, not from the resume (benchmarks read the
    train time of a resumed run from them). The checkpoint is edited to say that 10^6 s came before."""
    config = tiny_config(tmp_path, "train.max_steps=3", "train.eval_every_steps=3")
    fit(config)
    payload = load_checkpoint(tmp_path / "last.pt")
    before = payload["progress"]
    assert before["history"] and 0 < before["history"][-1]["seconds"] <= before["seconds"]
    before["seconds"] = 1e6
    save_checkpoint(tmp_path / "last.pt", payload)

    summary = fit(tiny_config(tmp_path, "train.max_steps=6", "train.eval_every_steps=3"), resume=True)
    after = load_checkpoint(tmp_path / "last.pt")["progress"]
    resumed = [entry["seconds"] for entry in after["history"][len(before["history"]):]]
    assert resumed and all(1e6 < seconds < 1e6 + 600 for seconds in resumed)
    assert 1e6 < after["seconds"] <= summary["seconds"] < 1e6 + 600


def test_same_config_gives_same_weights_whatever_the_global_rng(tmp_path: Path, tiny_config) -> None:
    torch.manual_seed(1)
    fit(tiny_config(tmp_path / "x", "train.max_steps=2"))
    torch.manual_seed(2)
    torch.rand(100)
    fit(tiny_config(tmp_path / "y", "train.max_steps=2"))
    x, y = _state(tmp_path / "x" / "last.pt")["decoder"], _state(tmp_path / "y" / "last.pt")["decoder"]
    assert all(torch.equal(x[name], y[name]) for name in x)
    z_config = tiny_config(tmp_path / "z", "train.max_steps=2", "train.seed=1")
    fit(z_config)
    z = _state(tmp_path / "z" / "last.pt")["decoder"]
    assert not torch.equal(x["out.weight"], z["out.weight"])  # the seed does matter


# the weights' average (train.ema_decay) -----------------------------------------------------------


def test_the_average_follows_its_formula_and_is_what_is_validated(tmp_path: Path, tiny_config,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """After one step the average is the trained weights; after two, d * w_1 + (1 - d) * w_2. The
    checkpoint's "decoder" (what eval.py and caption load) and validation both use it."""
    decay = 0.75
    validated = []
    real_validate = captioning.train.loop.validation_metrics

    def spy(decoder, *args, **kwargs):
        validated.append({name: value.clone() for name, value in decoder.state_dict().items()})
        return real_validate(decoder, *args, **kwargs)

    monkeypatch.setattr(captioning.train.loop, "validation_metrics", spy)
    fit(tiny_config(tmp_path / "one", "train.max_steps=1", f"train.ema_decay={decay}"))
    one = _state(tmp_path / "one" / "last.pt")
    fit(tiny_config(tmp_path / "two", "train.max_steps=2", f"train.ema_decay={decay}"))
    two = _state(tmp_path / "two" / "last.pt")
    fit(tiny_config(tmp_path / "plain", "train.max_steps=2"))
    without = _state(tmp_path / "plain" / "last.pt")

    w1, w2 = one["training_decoder"], two["training_decoder"]
    assert two["decoder"].keys() == w2.keys() == without["decoder"].keys()  # loads as a plain decoder does
    assert all(torch.equal(one["decoder"][name], w1[name]) for name in w1)
    assert all(torch.equal(w2[name], without["decoder"][name]) for name in w2)  # averaging does not steer training
    assert "training_decoder" not in without
    moved = 0
    for name in w1:
        expected = decay * w1[name] + (1 - decay) * w2[name]
        torch.testing.assert_close(two["decoder"][name], expected, rtol=0, atol=1e-6)
        moved += not torch.equal(w1[name], w2[name])
    assert moved  # the second step changed weights, so the average differs from both
    assert len(validated) == 3  # each run validates once, at its end
    for name, value in validated[1].items():
        assert torch.equal(value, two["decoder"][name]), name
    # and best.pt (the only evaluation was the best so far) holds the same average
    best = _state(tmp_path / "two" / "best.pt")
    assert all(torch.equal(best["decoder"][name], two["decoder"][name]) for name in w1)


@pytest.mark.parametrize(("override", "message"), [
    ("train.ema_decay=1.0", "train.ema_decay must be in [0, 1)"),
    ("train.ema_decay=-0.5", "train.ema_decay must be in [0, 1)"),
    ("encoder.fine_tune_from=layer4", "does not go with encoder.fine_tune_from"),
])
def test_a_bad_average_is_a_config_error(tmp_path: Path, tiny_config, override: str, message: str) -> None:
    extra = ("train.ema_decay=0.9",) if override.startswith("encoder.") else ()
    with pytest.raises(ConfigError, match=re.escape(message)):
        tiny_config(tmp_path, *extra, override)


# overfitting one batch -----------------------------------------------------------------------------


def _tiny_decoder(dropout: float = 0.0, vocab_size: int = 11, annotation_dim: int = 8):
    model = ModelConfig(embed_dim=16, hidden_dim=16, attention_dim=16, dropout=dropout)
    return build_decoder(model, vocab_size=vocab_size, annotation_dim=annotation_dim)


def _fixed_batch() -> Batch:
    generator = torch.Generator().manual_seed(0)
    annotations = torch.randn(2, 9, 8, generator=generator)  # [B, L, D]: B=2, 3x3 grid, D=8
    tokens = torch.tensor([[1, 4, 5, 6, 7, 8, 2], [1, 9, 10, 4, 2, 0, 0]])
    return Batch(annotations=annotations, tokens=tokens, lengths=torch.tensor([7, 5]))


def test_overfit_one_batch() -> None:
    torch.manual_seed(0)
    decoder = _tiny_decoder()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    batch = _fixed_batch()
    history = [train_step(decoder, batch, optimizer, grad_clip=5.0, ds_lambda=0.0).losses["xe"]
               for _ in range(150)]
    assert history[0] > 1.5  # about log(11) at the start
    assert history[-1] < 0.3 * history[0], history[::10]
    assert history[-1] < 0.1


def test_word_weights_reach_the_step_and_name_unknown_words() -> None:
    vocab = Vocabulary([*SPECIALS, "above", "below", "circle"])
    vector = word_weight_vector({"above": 4.0, "circle": 0.5}, vocab)
    expected = torch.ones(len(vocab))
    expected[vocab.index["above"]], expected[vocab.index["circle"]] = 4.0, 0.5
    torch.testing.assert_close(vector, expected)
    with pytest.raises(TrainingError, match="not in the vocabulary: abvoe, belwo"):
        word_weight_vector({"belwo": 2.0, "abvoe": 2.0, "below": 2.0}, vocab)

    weights = torch.ones(11)
    weights[5] = 3.0
    losses = []
    for word_weights in (None, weights):
        torch.manual_seed(0)
        decoder = _tiny_decoder()
        optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
        losses.append(train_step(decoder, _fixed_batch(), optimizer, grad_clip=5.0, ds_lambda=0.0,
                                 word_weights=word_weights).losses["xe"])
    assert losses[1] > losses[0]  # word 5's term counts three times


def test_a_run_with_word_weights_trains_resumes_from_its_config_and_rejects_unknown_words(tmp_path: Path,
                                                                                        tiny_config) -> None:
    out = tmp_path / "run"
    fit(tiny_config(out, "train.max_steps=2", "train.word_weights={above: 4, below: 4}"))
    payload = load_checkpoint(out / "last.pt")  # weights_only: the mapping is plain data
    assert from_dict(payload["config"]).train.word_weights == {"above": 4, "below": 4}
    with pytest.raises(TrainingError, match="train.word_weights: not in the vocabulary: abvoe"):
        fit(tiny_config(tmp_path / "typo", "train.max_steps=2", "train.word_weights={abvoe: 4}"))
    assert not (tmp_path / "typo" / "last.pt").exists()


def test_the_samples_of_a_caption_share_one_pass_of_the_encoder() -> None:
    """train.reinforce.location_samples = K copies of each caption for leave-one-out: the CNN still sees
    each image once, and the decoder gets each image's annotations K times, in the rows of that caption's copies."""
    from captioning.model.encoder_decoder import EncoderDecoder
    from captioning.model.paper import Reinforce

    class Encoder(torch.nn.Module):  # stands in for a fine-tuned CNN: images [B, 8, 3, 3] -> [B, 9, 8]
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()))
            self.rows_seen = []

        def forward(self, images):
            self.rows_seen.append(images.shape[0])
            return self.scale * images.flatten(2).transpose(1, 2), (3, 3)

    torch.manual_seed(0)
    model = ModelConfig(embed_dim=16, hidden_dim=16, attention_dim=16, attention="hard",
                        hard=HardConfig(expectation_prob=0.0), dropout=0.0)
    decoder = build_decoder(model, vocab_size=11, annotation_dim=8)
    seen = []
    decoder.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    model = EncoderDecoder(decoder=decoder, encoder=Encoder())
    fixed = _fixed_batch()
    images = fixed.annotations.transpose(1, 2).reshape(2, 8, 3, 3)  # [B, 8, 3, 3]
    batch = Batch(annotations=None, images=images, tokens=fixed.tokens, lengths=fixed.lengths)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(model, batch, optimizer, grad_clip=5.0, ds_lambda=0.0,
               reinforce=Reinforce(baseline="leave_one_out", location_samples=3))
    assert model.encoder.rows_seen == [2]  # once per image, not once per copy
    assert seen[0].shape == (6, 9, 8)
    for row in range(6):
        torch.testing.assert_close(seen[0][row], fixed.annotations[row // 3])
    assert model.encoder.scale.grad is not None and model.encoder.scale.grad.abs() > 0


# non-finite losses ---------------------------------------------------------------------------------


def test_a_non_finite_loss_skips_the_update() -> None:
    torch.manual_seed(0)
    decoder = _tiny_decoder()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    with torch.no_grad():
        decoder.out.bias[5] = float("nan")
    before = {name: value.clone() for name, value in decoder.state_dict().items()}
    losses = train_step(decoder, _fixed_batch(), optimizer, grad_clip=5.0, ds_lambda=0.0)
    assert losses.skipped and not math.isfinite(losses.losses["loss"])
    after = decoder.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before if n != "out.bias")
    assert not optimizer.state  # the optimizer never stepped: no NaN in its moments either
    assert all(p.grad is None for p in decoder.parameters())


def _poison(monkeypatch, steps: set[int] | None = None, *, from_step: int | None = None) -> list[int]:
    """Make the cross-entropy NaN at the given (1-based) calls, or at every call from `from_step` on."""
    real = training_objective.cross_entropy
    calls = []

    def poisoned(logits, targets, mask, **weights):
        calls.append(1)
        loss = real(logits, targets, mask, **weights)
        bad = (steps is not None and len(calls) in steps) or (from_step is not None and len(calls) >= from_step)
        return loss * float("nan") if bad else loss

    monkeypatch.setattr(training_objective, "cross_entropy", poisoned)
    return calls


def test_an_isolated_non_finite_step_is_skipped_and_the_run_goes_on(tmp_path: Path, tiny_config,
                                                                     monkeypatch) -> None:
    _poison(monkeypatch, {3, 5, 7})  # three in all, never two in a row
    out = tmp_path / "run"
    summary = fit(tiny_config(out, "train.max_steps=10", "train.log_every_steps=1", "train.max_bad_steps=2"))
    assert summary["steps"] == 10
    logged = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if '"loss"' in line]
    # the skipped steps' numbers are not logged (nor averaged into anything): the steps that trained are
    assert [e["step"] for e in logged] == [1, 2, 4, 6, 8, 9, 10]
    assert [e["skipped_steps"] for e in logged] == [0, 0, 1, 2, 3, 3, 3]
    assert all(math.isfinite(e["loss"]) for e in logged)
    payload = load_checkpoint(out / "last.pt")
    assert payload["progress"]["skipped_steps"] == 3 and payload["progress"]["bad_steps_in_a_row"] == 0
    assert all(torch.isfinite(v).all() for v in payload["decoder"].values())


def test_non_finite_steps_in_a_row_stop_the_run_keeping_the_last_good_checkpoint(tmp_path: Path, tiny_config,
                                                                                  monkeypatch) -> None:
    calls = _poison(monkeypatch, from_step=5)
    out = tmp_path / "run"
    config = tiny_config(out, "train.max_steps=30", "train.eval_every_steps=3", "train.max_bad_steps=4")
    with pytest.raises(TrainingError, match="step 8: the loss or its gradient was not finite 4 steps in a row"):
        fit(config)
    assert len(calls) == 8
    payload = load_checkpoint(out / "last.pt")  # written at step 6 (evaluations at 3 and 6): readable, finite
    assert payload["progress"]["step"] == 6
    assert all(torch.isfinite(v).all() for v in payload["decoder"].values())
    assert not list(out.glob(".*.tmp")) and not list(out.glob("*.tmp"))


# atomic saves --------------------------------------------------------------------------------------


def test_save_checkpoint_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"decoder": {"w": torch.arange(3.0)}, "progress": {"step": 7}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    payload = load_checkpoint(path)
    assert torch.equal(payload["decoder"]["w"], torch.arange(3.0)) and payload["progress"]["step"] == 7
    save_checkpoint(path, {"progress": {"step": 8}})  # overwriting works the same way
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    assert load_checkpoint(path)["progress"]["step"] == 8


def test_a_save_that_dies_midway_leaves_the_old_checkpoint(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"progress": {"step": 1}})
    real_save = torch.save

    def dying_save(obj, target, *args, **kwargs):  # target: the temporary file, open
        target.write(b"PK\x03\x04 half a zip")
        raise stop

    monkeypatch.setattr(checkpoint_module.torch, "save", dying_save)
    stop = OSError("disk full")
    with pytest.raises(checkpoint_module.CheckpointError, match="disk full.*the previous last.pt is intact"):
        save_checkpoint(path, {"progress": {"step": 2}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # the half-written file is gone
    stop = KeyboardInterrupt()  # a second Ctrl-C, while training saves after the first
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"progress": {"step": 2}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)
    assert load_checkpoint(path)["progress"]["step"] == 1


def test_unreadable_checkpoints_raise_checkpoint_error_naming_the_path(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00\x01 not a checkpoint" * 50)
    truncated = tmp_path / "truncated.pt"
    save_checkpoint(truncated, {"decoder": {"w": torch.zeros(1000)}})
    truncated.write_bytes(truncated.read_bytes()[:500])
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)  # a torch file, but not one of ours
    missing = tmp_path / "missing.pt"
    for path in (garbage, truncated, foreign, missing):
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(path)
        assert str(path) in str(error.value)
        assert "\n" not in str(error.value)


def test_checkpoint_with_pickled_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format_version": checkpoint_module.FORMAT_VERSION, "payload": Path("/etc/passwd")}, path)
    with pytest.raises(CheckpointError, match="evil.pt"):
        load_checkpoint(path)


def test_soft_attention_refuses_the_reinforce_settings_it_would_ignore(tmp_path: Path, tiny_config) -> None:
    """train.reinforce is hard attention's (REINFORCE trains the sampled cells, Sec. 4.1): with soft
    attention its settings would be taken and ignored, so the config refuses them by name before
    any work; without them the same run trains."""
    with pytest.raises(ConfigError, match="train.reinforce applies only with model.attention=hard and "
                                          "train.objective=xe, not model.attention=soft"):
        tiny_config(tmp_path / "three", "train.max_steps=2", "train.reinforce.location_samples=3",
                    "train.reinforce.baseline=leave_one_out")
    fit(tiny_config(tmp_path / "one", "train.max_steps=2"))
    assert _state(tmp_path / "one" / "last.pt")["reinforce"] == {}


def test_a_skipped_step_moves_neither_the_weights_nor_their_average(tmp_path: Path, tiny_config) -> None:
    """train.ema_decay: the average follows applied steps only. A skipped step changed no weight;
    counting it would pull the average towards weights it already partly holds."""
    from dataclasses import replace

    from captioning.runtime.hardware import Hardware
    from captioning.train.loop import Run

    run = Run.start(tiny_config(tmp_path / "run", "train.ema_decay=0.5"), resume=False,
                    hardware=Hardware.setup("cpu", amp=False))
    global_batches = run.objective.batches(0)
    batches = iter(run.loader(global_batches))
    for _ in range(2):  # applied: the weights move, the average (a copy at first) half way after them
        assert run.step(next(batches), size=16) is not None
    average = run.model.average.averaged
    before = {name: value.clone() for name, value in average.state_dict().items()}
    weights = {name: value.clone() for name, value in run.model.decoder.state_dict().items()}
    assert any(not torch.equal(weights[name], before[f"module.{name}"]) for name in weights)
    bad = next(batches)
    assert run.step(replace(bad, annotations=bad.annotations * float("nan")), size=16) is None  # skipped: not logged
    assert run.progress.skipped_steps == 1
    assert all(torch.equal(value, before[name]) for name, value in average.state_dict().items())
    assert all(torch.equal(value, weights[name]) for name, value in run.model.decoder.state_dict().items())
    run.close()


def test_pairs_left_out_of_a_batch_leave_the_others_their_own_draws(tmp_path: Path, tiny_config,
                                                                    monkeypatch) -> None:
    """collate_image_pairs leaves out the pairs whose image could not be read and says where the others
    sat; hard attention's draws are then picked by those positions (paper_objective.row_uniforms), so every kept
    caption samples what it would have sampled in the whole batch."""
    from dataclasses import replace

    from captioning.data.dataset import collate_image_pairs
    from captioning.runtime.hardware import Hardware
    from captioning.train.loop import Run

    pixels, tokens = torch.zeros(3, 8, 8), [1, 5, 2]
    batch = collate_image_pairs([(pixels, tokens, None), (None, tokens, "b.jpg: broken"), (pixels, tokens, None),
                            (None, tokens, "d.jpg: broken")])
    assert batch.positions.tolist() == [0, 2] and batch.tokens.shape[0] == 2
    assert collate_image_pairs([(pixels, tokens, None)]).positions is None  # nothing left out: no positions

    run = Run.start(tiny_config(tmp_path / "run", "model.attention=hard", "data.max_bad_images=0.5"), resume=False,
                    hardware=Hardware.setup("cpu", amp=False))
    whole = next(iter(run.loader(run.objective.batches(0))))
    seen = []
    real = cross_entropy.row_uniforms
    monkeypatch.setattr(cross_entropy, "row_uniforms", lambda **kw: seen.append(kw) or real(**kw))
    kept = torch.tensor([1, 4, 5])
    part = replace(whole, annotations=whole.annotations[kept], tokens=whole.tokens[kept], lengths=whole.lengths[kept],
                   failures=("x.jpg: broken",), positions=kept)
    run.step(part, size=16)
    assert seen[0]["rows"] == 3 and torch.equal(seen[0]["positions"], kept) and seen[0]["coin"] == "image"
    run.close()


def test_the_log_counts_epochs_from_one_in_its_progress_lines_and_validations_alike(
        tmp_path: Path, tiny_config, batches_per_epoch: int, monkeypatch, capsys) -> None:
    """A log file's progress lines, the validation lines and log.jsonl name the same epoch for the
    same steps: the first epoch is epoch 1 everywhere (the progress lines once said epoch 0)."""
    monkeypatch.setenv("CAPTIONING_LOG_SECONDS", "0")
    monkeypatch.delenv("CAPTIONING_QUIET", raising=False)
    fit(tiny_config(tmp_path, "train.epochs=1", "train.eval_every_steps=3", "train.val_images=4"))
    printed = capsys.readouterr()
    progress = re.findall(r"^epoch (\d+): \d+/\d+", printed.err, flags=re.MULTILINE)
    validations = re.findall(r"^step (\d+) epoch (\d+):", printed.out, flags=re.MULTILINE)
    assert set(progress) == {"1"}
    assert validations == [("3", "1"), ("6", "1"), (str(batches_per_epoch), "1")]
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert {entry["epoch"] for entry in logged} == {1}
