"""Mixed precision: one autocast path for training, chosen by `train.amp` and what the device does natively.

bf16 keeps fp32's exponent range, so it needs no loss scaling; it is used only where the hardware
computes it natively (Ampere and later GPUs, CPUs). Older GPUs (V100, T4) report bf16 as supported
through emulation, which is slow: there fp16 runs instead, with a gradient scaler whose state goes
into checkpoints. Without `train.amp` everything is fp32 (with TF32 matmuls where the GPU has them,
`train.tf32`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    """One autocast path: bf16 where native (no loss scaling needed), fp16 + a scaler otherwise."""

    device_type: str = "cpu"
    dtype: torch.dtype | None = None  # None: full precision

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None)

    def scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)


def native_bf16(device: torch.device) -> bool:
    """Whether the device computes bf16 itself (not through fp32 emulation, as V100 and T4 do)."""
    if device.type != "cuda":
        return True
    return torch.cuda.is_bf16_supported(including_emulation=False)


def precision_for(device: torch.device, *, amp: bool) -> Precision:
    if not amp:
        return Precision(device.type, None)
    return Precision(device.type, torch.bfloat16 if native_bf16(device) else torch.float16)


def allow_tf32(enabled: bool) -> None:
    """TF32 for fp32 matmuls and convolutions on GPUs that have it (Ampere and later): about 8x the
    fp32 throughput with a 10-bit mantissa, ample for training this model; no effect elsewhere."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


FULL_PRECISION = Precision()  # fp32 on any device: autocast disabled
