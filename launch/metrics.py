"""Run outputs for metrics: `metrics.jsonl` (one JSON object per optimiser step) and TensorBoard events.

Values are converted to plain floats; non-finite values are written as null in JSON (and skipped in
TensorBoard) so a reader never chokes on NaN. Keys are defined in docs/metrics.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (closed in close())
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": step} | {k: _plain(v) for k, v in metrics.items() if k != "step"}
        self._jsonl.write(json.dumps(row, sort_keys=False) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, global_step=step)
        return row

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All rows of a run's metrics.jsonl (a truncated last line from a crash is ignored)."""
    rows = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (is {run_dir} a run folder?)")
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
