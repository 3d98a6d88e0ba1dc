"""The static training step that a CUDA graph holds (captioning/train/graphed.py), run eagerly on the
CPU: it must take the eager step's steps (train_step: the rows packed by length, nothing past a
caption's end computed), skip a non-finite step on the device with nothing moved, and never read a
value on the host. The capture and its replays run on the CPU's stand-in for CUDA graphs
(tests/cuda_graphs.py); on a GPU, benchmarks/gpu/gpu.py's `graph` part runs them."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from captioning.config import load_config
from captioning.model.encoder_decoder import build_decoder
from captioning.train.graphed import BUCKET, WARMUP, GraphedStep, bucket_length
from captioning.train.paper_objective import train_step
from tests.cuda_graphs import cpu_cuda_graphs
from tests.syncs import counting_syncs
from tests.train.test_syncs import D, V, _batch

GRAD_CLIP, DS_LAMBDA = 5.0, 1.0
LENGTHS = ([5, 7, 4], [3, 2, 3], [12, 9, 14])  # 2 of them under one bucket, one past it


def _decoder_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    config = load_config(None, ["model.embed_dim=8", "model.hidden_dim=16", "model.attention_dim=8",
                                "model.dropout=0"])  # no dropout: the two paths draw their masks over other positions
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=(3, 3))
    return decoder, torch.optim.Adam(decoder.parameters(), lr=0.01, fused=True)


def test_buckets_round_a_batchs_steps_up_to_a_multiple():
    assert [bucket_length(steps) for steps in (1, BUCKET, BUCKET + 1, 22)] == [BUCKET, BUCKET, 2 * BUCKET, 24]


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "word-weights"])
def test_the_static_step_takes_the_eager_steps(weighted, monkeypatch):
    graphs = cpu_cuda_graphs(monkeypatch)  # there, but off CUDA nothing is captured
    eager, eager_optimizer = _decoder_and_optimizer()
    graphed = copy.deepcopy(eager)
    # train.word_weights: some target words count several times (train/extras/word_weights.py)
    weights = torch.linspace(0.5, 3.0, V) if weighted else None
    step = GraphedStep(graphed, torch.optim.Adam(graphed.parameters(), lr=0.01, fused=True), grad_clip=GRAD_CLIP,
                       ds_lambda=DS_LAMBDA, word_weights=weights)
    for seed, lengths in enumerate(LENGTHS * 2):
        batch = _batch(seed, lengths)
        want = train_step(eager, batch, eager_optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA,
                          word_weights=weights)
        got = step(batch)
        assert not got.skipped
        for name in ("loss", "xe", "ds", "grad_norm"):
            assert got.losses[name] == pytest.approx(want.losses[name], rel=1e-5), name
    initial, _ = _decoder_and_optimizer()
    for (name, got), want, start in zip(graphed.named_parameters(), eager.parameters(), initial.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=name)
        assert not torch.equal(got, start), name  # every weight moved
    # two computations (padded rows run to the bucket's end), not one: they round apart somewhere
    assert any(not torch.equal(got, want) for got, want in zip(graphed.parameters(), eager.parameters()))
    # each batch padded to its bucket: tokens of 7 and 3 become 9 (8 steps), of 14 become 17 (16 steps);
    # two shapes, each stepped as often as its batches came (the count a capture waits on)
    assert step.seen == {(3, 9, D, 9): 4, (3, 9, D, 17): 2}
    assert graphs.captured == [] and graphs.pools == 0


@pytest.mark.filterwarnings("error")  # torch's warning of a capturable optimizer stepped eagerly, among others
def test_captured_graphs_replay_the_eager_steps_and_a_new_rate_captures_again(monkeypatch):
    """Each shape's first WARMUP steps run eagerly, its next is captured and replayed, the rest replay
    with the new batch copied in; a learning rate the schedule moved captures every shape again."""
    graphs = cpu_cuda_graphs(monkeypatch)
    eager, eager_optimizer = _decoder_and_optimizer()
    graphed = copy.deepcopy(eager)
    optimizer = torch.optim.Adam(graphed.parameters(), lr=0.01, fused=True)
    step = GraphedStep(graphed, optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA, capture=True)
    batches = LENGTHS * 4  # 8 batches of the first shape, 4 of the second
    for seed, lengths in enumerate(batches):
        if seed == 9:  # the schedule moves the rate after 6 steps of the first shape, 3 of the second
            for group in (*optimizer.param_groups, *eager_optimizer.param_groups):
                group["lr"] = 0.005
        batch = _batch(seed, lengths)
        want = train_step(eager, batch, eager_optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA)
        got = step(batch)
        assert not got.skipped
        for name in ("loss", "xe", "ds", "grad_norm"):
            assert got.losses[name] == pytest.approx(want.losses[name], rel=1e-5), (seed, name)
    for (name, got), want in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=name)
    assert step.seen == {(3, 9, D, 9): WARMUP, (3, 9, D, 17): WARMUP}
    # replays per graph, each capture's own first replay counted. The first shape: captured at its 4th
    # batch, replayed at its 5th and 6th; after the new rate, captured again at once (its warm-up was
    # done) and replayed at its last. The second: eager for 3, its 4th (after the new rate) captured.
    assert graphs.replays == [3, 2, 1]
    assert step.rates == [0.005] and len(step.graphs) == 2
    # the shapes' graphs share one memory pool; the new rate's graphs a fresh one (the old keeps what
    # its captures allocated for good)
    first, *after = (graph.pool for graph in graphs.captured)
    assert first is not None and after[0] is not None and after[0] == after[1] != first
    assert optimizer.state_dict()["param_groups"][0]["capturable"] is False  # a checkpoint keeps no capture's flag


def test_a_captured_step_under_bf16_autocast_replays_the_uncaptured_one(monkeypatch):
    """bf16 autocast casts the weights inside the step, so a replay must cast them again from the
    weights the last step moved (a cast kept from before the capture would be stale): the captured
    step, replayed, takes the same steps as the same static step run eagerly."""
    from captioning.runtime.precision import Precision

    graphs = cpu_cuda_graphs(monkeypatch)
    bf16 = Precision("cpu", torch.bfloat16)
    decoders, steps = [], []
    for capture in (False, True):
        decoder, optimizer = _decoder_and_optimizer()
        decoders.append(decoder)
        steps.append(GraphedStep(decoder, optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA, precision=bf16,
                                 capture=capture))
    for seed in range(WARMUP + 4):  # eager, captured, then 3 replays
        eager, captured = (step(_batch(seed)) for step in steps)
        assert captured.losses == pytest.approx(eager.losses, rel=1e-6, abs=1e-7), seed
    assert graphs.replays == [4]
    for (name, got), want in zip(decoders[1].named_parameters(), decoders[0].parameters()):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=name)


def test_a_replayed_step_whose_loss_is_not_finite_moves_nothing(monkeypatch):
    cpu_cuda_graphs(monkeypatch)
    decoder, optimizer = _decoder_and_optimizer()
    step = GraphedStep(decoder, optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA, capture=True)
    for seed in range(WARMUP + 1):  # eager, then captured
        step(_batch(seed))
    before = copy.deepcopy((decoder.state_dict(), optimizer.state_dict()))
    poisoned = _batch(10)
    poisoned.annotations[0, 0, 0] = float("nan")
    result = step(poisoned)
    assert result.skipped and len(step.graphs) == 1
    for name, value in decoder.state_dict().items():
        assert torch.equal(value, before[0][name]), name
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            assert torch.equal(value, before[1]["state"][index][key]), (index, key)
    assert not step(_batch(11)).skipped  # the graph's next finite step moves again
    assert not torch.equal(decoder.state_dict()["embed.weight"], before[0]["embed.weight"])


@pytest.mark.parametrize("tokens, padded", [(BUCKET + 1, BUCKET + 1), (BUCKET + 2, 2 * BUCKET + 1)])
def test_a_batch_at_a_buckets_edge_is_padded_to_its_own_bucket(tokens, padded):
    """Tokens [B, T + 1]: the T steps of the inputs decide the bucket, 8 steps fill the first exactly."""
    decoder, optimizer = _decoder_and_optimizer()
    step = GraphedStep(decoder, optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA)
    step(_batch(4, [tokens, 3]))
    assert step.seen == {(2, 9, D, padded): 1}


def test_a_step_whose_loss_is_not_finite_moves_nothing():
    decoder, optimizer = _decoder_and_optimizer()
    step = GraphedStep(decoder, optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA)
    step(_batch(0))
    before = copy.deepcopy((decoder.state_dict(), optimizer.state_dict()))
    poisoned = _batch(1)
    poisoned.annotations[0, 0, 0] = float("nan")
    result = step(poisoned)
    assert result.skipped
    for name, value in decoder.state_dict().items():
        assert torch.equal(value, before[0][name]), name
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():  # the moments and the step count
            assert torch.equal(value, before[1]["state"][index][key]), (index, key)
    assert not step(_batch(2)).skipped  # the next finite step moves again
    assert not torch.equal(decoder.state_dict()["embed.weight"], before[0]["embed.weight"])


def test_a_gradient_norm_that_is_not_finite_skips_the_step_though_the_loss_is(monkeypatch):
    decoder, optimizer = _decoder_and_optimizer()
    step = GraphedStep(decoder, optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA)
    step(_batch(0))
    before = copy.deepcopy(decoder.state_dict())
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda parameters, limit: torch.tensor(float("inf")))
    result = step(_batch(1))
    assert result.skipped and math.isfinite(result.losses["loss"])
    for name, value in decoder.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_the_static_step_never_reads_a_value_on_the_host():
    decoder, optimizer = _decoder_and_optimizer()
    step = GraphedStep(decoder, optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA)
    batch = _batch(3, [12, 9, 14])
    step(batch)  # the fast path checks itself on first use, outside the step a graph holds
    optimizer.zero_grad(set_to_none=True)
    with counting_syncs() as syncs:
        step.step(batch.annotations, batch.tokens)
    assert syncs.total == 0, syncs.sites
    with counting_syncs() as eager:  # the counter sees the eager step's trips
        train_step(decoder, batch, optimizer, grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA)
    assert eager.total >= 2


def test_the_graph_needs_fused_adam():
    decoder, _ = _decoder_and_optimizer()
    with pytest.raises(ValueError, match="fused Adam"):
        GraphedStep(decoder, torch.optim.Adam(decoder.parameters()), grad_clip=GRAD_CLIP, ds_lambda=DS_LAMBDA)


def test_a_run_with_train_graph_trains_as_the_eager_run(tmp_path, tiny_config, monkeypatch):
    """train.graph in a whole run (train/step.py's Stepping), its graphs captured and replayed as on
    CUDA (on the CPU's stand-in; each shape captured at its second batch): the same steps as the eager
    run, to float tolerance, with a validation and a checkpoint between them, and a resumable
    checkpoint of them."""
    from captioning.train import graphed, step
    from captioning.train.loop import fit

    graphs = cpu_cuda_graphs(monkeypatch)
    monkeypatch.setattr(graphed, "WARMUP", 1)
    monkeypatch.setattr(step, "GraphedStep", lambda *args, **kwargs: GraphedStep(*args, capture=True, **kwargs))
    taken = []
    real = GraphedStep.__call__
    monkeypatch.setattr(GraphedStep, "__call__", lambda self, batch: taken.append(1) or real(self, batch))
    steps = ("train.max_steps=5", "model.dropout=0", "train.val_images=4", "train.log_images=0",
             "train.eval_every_steps=3")
    fit(tiny_config(tmp_path / "eager", *steps))
    assert not taken
    fit(tiny_config(tmp_path / "graph", *steps, "train.graph=true"))
    assert len(taken) == 5  # every step of the run was the graph's
    assert graphs.captured and sum(graphs.replays) > len(graphs.captured)  # some step replayed a capture
    eager, graph = (torch.load(tmp_path / name / "last.pt", map_location="cpu", weights_only=True)
                    for name in ("eager", "graph"))
    assert graph["progress"]["step"] == eager["progress"]["step"] == 5
    for name, want in eager["decoder"].items():
        torch.testing.assert_close(graph["decoder"][name], want, rtol=1e-4, atol=1e-5, msg=name)
    assert fit(tiny_config(tmp_path / "graph", "train.max_steps=7", *steps[1:], "train.graph=true"),
               resume=True)["steps"] == 7


@pytest.mark.parametrize("overrides, named", [
    (("model.attention=hard",), "model.attention=soft"),
    (("model.fused=false",), "model.fused=true"),
    (("train.optimizer=rmsprop",), "train.optimizer=adam"),
    (("train.objective=xe_probe",), "train.objective=xe_probe is not"),
    (("train.terms={graph_probe: 0.01}",), "train.terms"),
    (("data.feature_cache=false",), "encoder on the fly"),
])
def test_the_config_refuses_what_the_graph_does_not_hold(monkeypatch, overrides, named):
    from captioning.config import ConfigError
    from captioning.config.registry import OBJECTIVES, TERMS
    from captioning.train.paper_objective import PaperObjective

    monkeypatch.setattr(TERMS, "_entries", {**TERMS.entries, "graph_probe": lambda alphas, mask: alphas.sum()})
    # an objective of the paper's batches whose loss is its own: not the graph's
    monkeypatch.setattr(OBJECTIVES, "_entries", {**OBJECTIVES.entries,
                                                 "xe_probe": type("Probe", (PaperObjective,), {"paper_loss": False})})
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, ["train.graph=true", *overrides])
    load_config(None, list(overrides))  # each is fine without the graph


def test_a_decoder_the_fused_path_does_not_compute_is_refused_before_the_first_step(tmp_path, tiny_config):
    from captioning.train.loop import fit
    from captioning.train.objective import TrainingError

    for extra in ("model.extras.query_word=true", "model.score=dot"):
        with pytest.raises(TrainingError, match="train.graph needs the fused path"):
            fit(tiny_config(tmp_path, extra, "train.graph=true", "train.max_steps=1"))
        assert not (tmp_path / "last.pt").exists()
