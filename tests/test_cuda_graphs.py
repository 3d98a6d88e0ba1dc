"""The CPU's stand-in for CUDA graphs (tests/cuda_graphs.py) held to what CUDA does: a capture runs
nothing that shows, a replay computes what the block would compute on the captured inputs' new
values, a value Python read at capture is baked in, and a read on the host is refused, as is an
optimizer's step that is not capturable."""

from __future__ import annotations

import pytest
import torch

from tests.cuda_graphs import cpu_cuda_graphs


def _regression(seed: int = 0):
    torch.manual_seed(seed)
    weight = torch.randn(3, 2, requires_grad=True)
    return weight, torch.optim.Adam([weight], lr=0.1, fused=True)


def _step(weight, optimizer, inputs):
    """A training step: forward, backward into fresh gradients, fused Adam. Returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = (inputs @ weight).tanh().pow(2).sum()  # [4, 2] -> 0-dim
    loss.backward()
    optimizer.step()
    return loss.detach()


def test_a_replay_takes_the_eager_steps_on_each_new_input(monkeypatch):
    graphs = cpu_cuda_graphs(monkeypatch)
    weight, optimizer = _regression()
    eager_weight, eager_optimizer = _regression()
    first = torch.randn(4, 3)
    for pair in ((weight, optimizer), (eager_weight, eager_optimizer)):  # Adam's state, made eagerly
        _step(*pair, first)
    optimizer.param_groups[0]["capturable"] = True

    static = first.clone()
    before = (weight.detach().clone(), {key: value.clone() for key, value in optimizer.state[weight].items()})
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = _step(weight, optimizer, static)
    # the capture ran nothing: the weights and Adam's moments and step as they were, the loss unwritten
    assert torch.equal(weight, before[0])
    for key, value in optimizer.state[weight].items():
        assert torch.equal(value, before[1][key]), key
    assert loss.isnan()

    for _ in range(3):
        inputs = torch.randn(4, 3)
        static.copy_(inputs)
        graph.replay()
        torch.testing.assert_close(loss, _step(eager_weight, eager_optimizer, inputs))
        torch.testing.assert_close(weight.detach(), eager_weight.detach())
    assert graphs.replays == [3]


def test_a_value_python_read_at_capture_is_baked_in(monkeypatch):
    cpu_cuda_graphs(monkeypatch)
    inputs, scale = torch.ones(2), 2.0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = inputs * scale
    scale = 5.0
    inputs.fill_(3.0)
    graph.replay()
    assert outputs.tolist() == [6.0, 6.0]


def test_a_read_on_the_host_is_refused_while_capturing(monkeypatch):
    cpu_cuda_graphs(monkeypatch)
    inputs = torch.ones(2)
    with pytest.raises(RuntimeError, match="host"), torch.cuda.graph(torch.cuda.CUDAGraph()):
        if inputs.sum() > 0:
            pass


def test_an_optimizer_that_is_not_capturable_is_refused_while_capturing(monkeypatch):
    cpu_cuda_graphs(monkeypatch)
    weight, optimizer = _regression()
    _step(weight, optimizer, torch.randn(4, 3))
    with pytest.raises(RuntimeError, match="capturable"), torch.cuda.graph(torch.cuda.CUDAGraph()):
        _step(weight, optimizer, torch.randn(4, 3))
    _step(weight, optimizer, torch.randn(4, 3))  # outside a capture it steps as before


def test_what_torch_refuses_of_a_capture_and_a_stream_the_stand_in_refuses(monkeypatch):
    cpu_cuda_graphs(monkeypatch)
    with pytest.raises(RuntimeError, match="capture_error_mode"), \
            torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="thread"):
        pass
    with pytest.raises(AttributeError, match="not a stream"):
        torch.cuda.Stream().wait_stream(None)
    torch.cuda.Stream().wait_stream(torch.cuda.current_stream())
