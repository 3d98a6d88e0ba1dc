"""A checkpoint cut for shipping (checkpoint.for_captioning): what captioning reads and nothing to
resume, the decoder stored in fp16 and computed in fp32, a release note that inspect shows."""

from __future__ import annotations

import pytest
import torch

from captioning.api import Captioner
from captioning.checkpoint import CheckpointError, describe, for_captioning, load_checkpoint, save_checkpoint


def test_an_exported_checkpoint_captions_and_holds_nothing_to_resume(tiny_run, tmp_path) -> None:
    payload = load_checkpoint(tiny_run.checkpoint)
    slim = for_captioning(payload, release={"licence": "research use"})
    path = tmp_path / "slim.pt"
    save_checkpoint(path, slim)
    again = load_checkpoint(path)
    assert {"optimizer", "scheduler", "rng", "scaler"}.isdisjoint(again) and "optimizer" in payload
    assert all(v.dtype == torch.float16 for v in again["decoder"].values() if v.is_floating_point())
    assert path.stat().st_size < tiny_run.checkpoint.stat().st_size / 2
    full = Captioner.from_checkpoint(tiny_run.checkpoint, device="cpu")
    cut = Captioner.from_checkpoint(path, device="cpu")
    assert all(p.dtype == torch.float32 for p in cut.model.decoder.parameters())
    for mine, theirs in zip(cut.model.decoder.state_dict().values(), full.model.decoder.state_dict().values()):
        if theirs.is_floating_point():  # fp16 storage: each weight rounded to about 3 digits, no more
            torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-4)
    assert "  release licence      research use" in describe(again, path)


def test_a_fine_tuned_encoder_is_not_exported_without_its_weights(tiny_run) -> None:
    payload = {**load_checkpoint(tiny_run.checkpoint), "encoder": {"conv.weight": torch.zeros(1)}}
    with pytest.raises(CheckpointError, match="fine-tuned encoder"):
        for_captioning(payload)
