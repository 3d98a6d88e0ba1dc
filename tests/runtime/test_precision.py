"""Precision that fits the card: bf16 only where the hardware computes it natively, fp16 with a
gradient scaler elsewhere, TF32 by train.tf32; both autocast paths run here on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from captioning.data.dataset import Batch
from captioning.model.encoder_decoder import build_decoder
from captioning.runtime import hardware, precision
from captioning.runtime.precision import Precision, allow_tf32, precision_for
from captioning.train.loop import fit
from captioning.train.paper_objective import train_step


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float16)])
def test_a_gpu_without_native_bf16_gets_fp16_with_a_scaler(monkeypatch, native: bool, expected: torch.dtype) -> None:
    """V100 and T4 say bf16 is supported (through emulation): only the native answer may count."""
    asked = {}

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        asked["including_emulation"] = including_emulation
        return native or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    precision = precision_for(torch.device("cuda"), amp=True)
    assert precision.dtype == expected and asked == {"including_emulation": False}
    assert precision_for(torch.device("cuda"), amp=False).dtype is None


def _cpu(monkeypatch, *, avx512_bf16: bool = False, amx: bool = False, machine: str = "x86_64",
         cpuinfo: str | None = None, tmp_path: Path | None = None) -> None:
    """This CPU, as torch's CPU checks, the machine name and /proc/cpuinfo describe it."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(precision.platform, "machine", lambda: machine)
    if tmp_path is not None:
        path = tmp_path / "cpuinfo"
        if cpuinfo is not None:
            path.write_text(cpuinfo)
        monkeypatch.setattr(precision, "CPUINFO", path)


@pytest.mark.parametrize(("described", "native"), [
    ({"avx512_bf16": True}, True),  # Zen 4, Cooper Lake and later
    ({"amx": True}, True),  # Sapphire Rapids
    ({}, False),  # AVX2 or AVX-512 without BF16: bf16 is emulated
    ({"machine": "aarch64", "cpuinfo": "processor : 0\nFeatures : fp asimd sve bf16 i8mm\n"}, True),  # Graviton 3
    ({"machine": "aarch64", "cpuinfo": "processor : 0\nFeatures : fp asimd crc32 atomics\n"}, False),  # Graviton 2
    ({"machine": "aarch64", "cpuinfo": "Features : fp asimd\nflags : bf16\n"}, False),  # only Features counts
], ids=["avx512-bf16", "amx", "x86-without", "arm-bf16", "arm-without", "arm-other-line"])
def test_train_amp_on_a_cpu_is_bf16_where_the_cpu_has_bf16_instructions_and_float32_elsewhere(
        monkeypatch, tmp_path: Path, described: dict, native: bool) -> None:
    """Emulated bf16 is several times slower than float32 on a CPU (the encoder's convolutions most),
    and a CPU has no fast fp16 either: without bf16 instructions train.amp runs in float32, saying why."""
    _cpu(monkeypatch, tmp_path=tmp_path, **described)
    chosen = precision_for(torch.device("cpu"), amp=True)
    assert chosen.dtype == (torch.bfloat16 if native else None)
    assert not chosen.scaler().is_enabled()
    if native:
        assert chosen.reason == "bf16 autocast (train.amp: this CPU computes bf16 natively)"
    else:
        assert chosen.reason.startswith("float32 (train.amp asked for bf16, but this CPU has no bf16 instructions")
    assert precision_for(torch.device("cpu"), amp=False).reason == "float32 (train.amp is off)"


def test_a_run_with_train_amp_says_in_one_line_which_precision_it_took(monkeypatch, tiny_run, tiny_config,
                                                                      tmp_path: Path, capsys) -> None:
    _cpu(monkeypatch, tmp_path=tmp_path)
    fit(tiny_config(tmp_path / "run", "train.amp=true", "train.max_steps=1"))
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("precision:")]
    assert said == ["precision: float32 (train.amp asked for bf16, but this CPU has no bf16 instructions (AVX512-BF16, "
                    "AMX or Arm BF16): emulated, it would run slower than float32)"]
    fit(tiny_config(tmp_path / "off", "train.max_steps=1"))
    assert "precision:" not in capsys.readouterr().err  # without train.amp there is nothing to choose


def _batch(vocab: int, *, seed: int = 0) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (6, 7), generator=generator)
    tokens[:, 0], tokens[:, -1] = 1, 2  # <start> .. <end>
    return Batch(annotations=torch.randn(6, 9, 8, generator=generator), tokens=tokens, lengths=torch.full((6,), 7))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_both_autocast_paths_train_on_the_cpu(tiny_config, tmp_path: Path, dtype: torch.dtype) -> None:
    config = tiny_config(tmp_path)
    torch.manual_seed(0)
    decoder = build_decoder(config.model, vocab_size=20, annotation_dim=8, grid=(3, 3))
    reference = build_decoder(config.model, vocab_size=20, annotation_dim=8, grid=(3, 3))
    reference.load_state_dict(decoder.state_dict())
    precision = Precision("cpu", dtype)
    scaler = precision.scaler()
    assert scaler.is_enabled() == (dtype == torch.float16)
    batch = _batch(20)
    optimizer = torch.optim.SGD(decoder.parameters(), lr=0.1)
    torch.manual_seed(1)  # the same dropout masks in both steps
    losses = train_step(decoder, batch, optimizer, grad_clip=5.0, ds_lambda=1.0,
                        precision=precision, scaler=scaler if scaler.is_enabled() else None)
    torch.manual_seed(1)
    full = train_step(reference, batch, torch.optim.SGD(reference.parameters(), lr=0.1), grad_clip=5.0,
                      ds_lambda=1.0)
    assert not losses.skipped and abs(losses.losses["loss"] - full.losses["loss"]) < 0.05 * full.losses["loss"]
    for (name, mixed), exact in zip(decoder.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(mixed, exact, atol=5e-3, rtol=0.05, msg=name)  # the same update, roughly
    if dtype == torch.float16:
        assert scaler.get_scale() == 2.0**16  # a finite step keeps the scale (it grows after 2000 of them)


def test_an_fp16_overflow_is_skipped_and_the_scale_backs_off(tiny_config, tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    torch.manual_seed(0)
    decoder = build_decoder(config.model, vocab_size=20, annotation_dim=8, grid=(3, 3))
    before = {k: v.clone() for k, v in decoder.state_dict().items()}
    precision = Precision("cpu", torch.float16)
    scaler = precision.scaler()
    batch = _batch(20)
    batch.annotations[0, 0, 0] = float("inf")
    losses = train_step(decoder, batch, torch.optim.SGD(decoder.parameters(), lr=0.1), grad_clip=5.0,
                        ds_lambda=0.0, precision=precision, scaler=scaler)
    assert losses.skipped and scaler.get_scale() == 2.0**15
    assert all(torch.equal(before[k], v) for k, v in decoder.state_dict().items())


def test_a_run_takes_the_fp16_path_and_keeps_the_scaler(monkeypatch, tiny_run, tiny_config, tmp_path: Path) -> None:
    """A whole run with a GPU's fp16 path, on the CPU: autocast, the scaler, its state in checkpoints."""
    monkeypatch.setattr(hardware, "precision_for", lambda device, amp: Precision(device.type, torch.float16))
    summary = fit(tiny_config(tmp_path / "run", "train.amp=true", "train.max_steps=3"))
    saved = torch.load(Path(summary["last"]), map_location="cpu", weights_only=True)
    assert summary["steps"] == 3 and saved["scaler"]["scale"] == 2.0**16


@pytest.mark.parametrize("tf32", [True, False])
def test_train_tf32_sets_the_matmul_and_convolution_flags(tiny_run, tiny_config, tmp_path: Path, tf32: bool) -> None:
    allow_tf32(not tf32)
    try:
        fit(tiny_config(tmp_path / "run", f"train.tf32={str(tf32).lower()}", "train.max_steps=1"))
        assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
    finally:
        allow_tf32(False)
