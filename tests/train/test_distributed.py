"""Two processes (torchrun, gloo on the CPU) train the same weights as one process with the same
global batch: each rank takes half of every global batch and weights its loss by its share of the
batch's words, so that DDP's gradient average is the one-process gradient."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import torch

from captioning.model.encoder_decoder import build_decoder
from captioning.runtime.hardware import Hardware
from captioning.train.loop import Run, fit
from tests.tiny import REPO

# Dropout off: two processes draw other masks than one, by design; everything else must match.
RUN = ("model.dropout=0", "train.max_steps=6", "train.batch_size=16", "train.log_every_steps=1")


def _last(out: Path) -> dict:
    return torch.load(out / "last.pt", map_location="cpu", weights_only=True)


def test_two_processes_train_the_same_weights_as_one(tmp_path: Path, tiny_run, tiny_config) -> None:
    one = tmp_path / "one"
    fit(tiny_config(one, *RUN))

    two = tmp_path / "two"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(REPO / "train.py"), "--device", "cpu", *tiny_run.overrides, f"train.out_dir={two}", *RUN]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("best CIDEr") == 1  # rank 0 alone reports

    a, b = _last(one), _last(two)
    assert a["progress"]["step"] == b["progress"]["step"] == 6
    config = tiny_config(one, *RUN)
    torch.manual_seed(config.train.seed)  # the initial weights, as the run built them
    initial = build_decoder(config.model, vocab_size=len(a["vocab"]), annotation_dim=a["annotation_dim"]).state_dict()
    moved = max(float((a["decoder"][n] - initial[n]).abs().max()) for n in initial)
    apart = max(float((a["decoder"][n] - b["decoder"][n]).abs().max()) for n in initial)
    # Only summation order differs (Adam at lr 0.01 amplifies it a little): 1e-5 where training moved 1e-1.
    assert moved > 0.05 and apart < 1e-4, (moved, apart)
    for name in initial:
        torch.testing.assert_close(b["decoder"][name], a["decoder"][name], rtol=1e-3, atol=1e-4, msg=name)
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    assert sorted(p.name for p in two.iterdir() if p.suffix == ".pt") == ["best.pt", "last.pt"]


def test_closing_a_run_releases_its_training_module(tmp_path: Path, tiny_config) -> None:
    """Under torchrun the training module is the DDP wrapper, whose reducer holds the gloo process
    group: it must be gone before distributed.teardown destroys the group, not at interpreter exit."""
    run = Run.start(tiny_config(tmp_path / "run", *RUN), resume=False, hardware=Hardware.setup("cpu", amp=False))
    module = weakref.ref(run.module)
    run.close()
    gc.collect()
    assert module() is None


def test_fine_tuned_batch_norm_is_synchronized_under_ddp_on_gpus_only() -> None:
    """SyncBatchNorm makes a fine-tuned stage normalize over the global batch; it has no CPU kernels,
    and the optimizer built before the conversion must still hold the parameters that train."""
    from torch import nn

    from captioning.model.encoder import build_encoder
    from captioning.runtime.distributed import Distributed, sync_batch_norm

    encoder = build_encoder(fine_tune_from="block4")
    trained = {name: p for name, p in encoder.named_parameters() if p.requires_grad}
    two = Distributed(rank=0, world_size=2)
    assert sync_batch_norm(encoder, Distributed(), device=torch.device("cuda")) is encoder
    assert sync_batch_norm(encoder, two, device=torch.device("cpu")) is encoder
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in encoder.modules())

    synced = sync_batch_norm(encoder, two, device=torch.device("cuda"))
    norms = [m for m in synced.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert norms and all(isinstance(m, nn.SyncBatchNorm) for m in norms)
    assert {name: p for name, p in synced.named_parameters() if p.requires_grad} == trained  # the same objects
    # the same function: timm's norms carry their activation (BatchNormAct2d), which a plain
    # SyncBatchNorm would drop; in eval mode both use the running statistics, so CPU can compare
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(synced.eval()(images), build_encoder(fine_tune_from="block4").eval()(images))
    synced.train()
    assert synced.body.block4.training and not synced.body.block3.training  # frozen stages keep their statistics
    frozen = build_encoder()
    assert sync_batch_norm(frozen, two, device=torch.device("cuda")) is frozen  # nothing trains: nothing to sync
