"""Mixed precision: one autocast path for training, chosen by `train.amp` and what the device does natively.

bf16 keeps fp32's exponent range, so it needs no loss scaling; it is used only where the hardware
computes it natively: Ampere and later GPUs, and CPUs with bf16 instructions (x86 AVX512-BF16 or
AMX, Arm's BF16 extension). Older GPUs (V100, T4) report bf16 as supported through emulation, which
is slow: there fp16 runs instead, with a gradient scaler whose state goes into checkpoints. A CPU
without bf16 instructions emulates it too (about 10x slower than float32 for the encoder's
convolutions), and has no fast fp16 either: there `train.amp` runs in float32. Without `train.amp`
everything is fp32 (with TF32 matmuls where the GPU has them, `train.tf32`). `Precision.reason`
is the one line a run prints about the choice.
"""

from __future__ import annotations

import contextlib
import platform
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Precision:
    """One autocast path: bf16 where native (no loss scaling needed), fp16 + a scaler otherwise."""

    device_type: str = "cpu"
    dtype: torch.dtype | None = None  # None: full precision
    reason: str = "float32"  # what was chosen and why, in one line

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None)

    def scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)


CPUINFO = Path("/proc/cpuinfo")  # Linux: what the CPU says it has


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 instructions: x86 AVX512-BF16 or AMX tiles (as torch's own CPU
    checks report them), or Arm's BF16 extension (Linux: the `bf16` flag in /proc/cpuinfo; macOS:
    hw.optional.arm.FEAT_BF16)."""
    for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        if getattr(torch.cpu, check, lambda: False)():
            return True
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return False
    if CPUINFO.exists():
        return any(line.startswith("Features") and "bf16" in line.split()
                   for line in CPUINFO.read_text(errors="replace").splitlines())
    try:
        answer = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                                timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return answer.stdout.strip() == "1"


def native_bf16(device: torch.device) -> bool:
    """Whether the device computes bf16 itself (not through fp32 emulation, as V100, T4 and CPUs
    without bf16 instructions do)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return cpu_has_native_bf16()
    return True


def precision_for(device: torch.device, *, amp: bool) -> Precision:
    """bf16 autocast where native; else fp16 with a scaler on a GPU, float32 on a CPU."""
    if not amp:
        return Precision(device.type, None, "float32 (train.amp is off)")
    if native_bf16(device):
        return Precision(device.type, torch.bfloat16, f"bf16 autocast (train.amp: this {device.type.upper()} "
                                                      "computes bf16 natively)")
    if device.type == "cuda":
        return Precision("cuda", torch.float16, "fp16 autocast with a gradient scaler (train.amp: this GPU "
                                                "emulates bf16)")
    return Precision(device.type, None, "float32 (train.amp asked for bf16, but this CPU has no bf16 instructions "
                                        "(AVX512-BF16, AMX or Arm BF16): emulated, it would run slower than float32)")


def allow_tf32(enabled: bool) -> None:
    """TF32 for fp32 matmuls and convolutions on GPUs that have it (Ampere and later): about 8x the
    fp32 throughput with a 10-bit mantissa, ample for training this model; no effect elsewhere."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """TF32 off inside the block, then as it was: for checks that hold two computations of the same
    equations to 1e-4, which TF32's 10-bit mantissa (relative error ~1e-3) cannot meet."""
    was = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    allow_tf32(False)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was


FULL_PRECISION = Precision()  # fp32 on any device: autocast disabled
