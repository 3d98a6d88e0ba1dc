"""What a run writes as it goes: TensorBoard events and OUT_DIR/log.jsonl (one JSON object per line).

Only the main process writes. A resumed run writes again what happened after its checkpoint, so
both logs are first cut back to the checkpoint's step: nothing appears twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter


def _step_of(line: str) -> float:
    """The step of a log line; a line torn by a kill mid-write counts as past every checkpoint."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


class RunLog:
    def __init__(self, out: Path, *, resumed_at: int | None):
        """`resumed_at`: the step of the checkpoint the run resumed from (None for a new run)."""
        self.path = out / "log.jsonl"
        # After a kill, events past the checkpoint's step are written again: purge the old ones.
        self.writer = SummaryWriter(str(out / "tensorboard"),
                                    purge_step=resumed_at + 1 if resumed_at is not None else None)
        lines = self.path.read_text().splitlines() if self.path.exists() and resumed_at else []
        kept = [line for line in lines if _step_of(line) <= (resumed_at or 0)]
        self.path.write_text("".join(f"{line}\n" for line in kept))

    def _line(self, entry: dict[str, Any]) -> None:  # one write per line, flushed at once
        with self.path.open("a") as file:
            file.write(json.dumps(entry) + "\n")

    def losses(self, *, step: int, epoch: int, losses: dict[str, float], lrs: list[float], skipped: int) -> None:
        for name, number in losses.items():
            self.writer.add_scalar(f"train/{name}", number, step)
        self.writer.add_scalar("train/lr", lrs[0], step)
        if len(lrs) > 1:
            self.writer.add_scalar("train/lr_encoder", lrs[1], step)
        self.writer.add_scalar("data/skipped_images", skipped, step)
        self._line({"step": step, "epoch": epoch, **losses, "lr": lrs, "skipped_images": skipped})

    def validation(self, *, step: int, epoch: int, metrics: dict[str, float]) -> None:
        for name, number in metrics.items():
            self.writer.add_scalar(f"val/{name}", number, step)
        self._line({"step": step, "epoch": epoch, "validation": metrics})

    def close(self) -> None:
        self.writer.close()
