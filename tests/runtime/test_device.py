"""A device asked for (`--device`, the API's `device=`) that is not one, or not on this machine, is
one line before any work: not a traceback from torch, nor one from the first tensor moved there."""

from __future__ import annotations

import pytest
import torch

from captioning.cli import main
from captioning.runtime.hardware import DeviceError, default_device


def test_a_device_is_the_one_named_or_the_gpu_where_there_is_one(monkeypatch) -> None:
    assert default_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert default_device(None) == torch.device("cuda") and default_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize(("name", "gpus", "says"), [
    ("gpu", 0, "device 'gpu': not a device (cpu, cuda, cuda:1 ...)"),
    ("cuda", 0, "device 'cuda': no CUDA GPU here (torch.cuda.is_available() is False)"),
    ("cuda:2", 2, "device 'cuda:2': this machine has 2 CUDA GPU(s), cuda:0 to cuda:1"),
])
def test_a_device_that_is_not_one_here_is_one_line(monkeypatch, name: str, gpus: int, says: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(DeviceError) as raised:
        default_device(name)
    assert str(raised.value) == says


@pytest.mark.parametrize("command", [["evaluate", "--checkpoint", "m.pt"], ["train"], ["verify", "m.pt"],
                                     ["prepare-features"], ["caption", "a.png", "--checkpoint", "m.pt"]])
def test_every_command_says_so_in_one_line_and_exits_2_before_any_work(command, capsys, tmp_path,
                                                                      monkeypatch) -> None:
    """Before any work: training and caching the embedded default would first draw its shapes data
    (data/shapes, under the working folder) where it is missing."""
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: device 'gpu': not a device (cpu, cuda, cuda:1 ...)"], err
    assert list(tmp_path.iterdir()) == []
