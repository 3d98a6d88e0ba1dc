"""Mixed precision: one autocast path for training, chosen by `train.amp` and what the device supports.

bf16 keeps fp32's exponent range, so it needs no loss scaling; fp16 (older GPUs) does, through a
gradient scaler whose state goes into checkpoints. Without `train.amp` everything is fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    """One autocast path: bf16 where supported (no loss scaling needed), fp16 + a scaler otherwise."""

    device_type: str = "cpu"
    dtype: torch.dtype | None = None  # None: full precision

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None)

    def scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)


def precision_for(device: torch.device, *, amp: bool) -> Precision:
    if not amp:
        return Precision(device.type, None)
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return Precision(device.type, torch.float16)
    return Precision(device.type, torch.bfloat16)


FULL_PRECISION = Precision()  # fp32 on any device: autocast disabled
