"""The live progress line: one self-overwriting line on a terminal, plain log lines elsewhere.

  step 12/60 | 41.3 samples/s | reward 0.53 | eval 0.61 | stale 0.8/2 | ETA 3m12s
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _fmt_eta(seconds: float) -> str:
    if not seconds or seconds != seconds or seconds == float("inf"):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def format_line(step: int, total: int, m: dict[str, Any], elapsed: float) -> str:
    def num(key: str, fmt: str = "{:.2f}") -> str:
        v = m.get(key)
        return "-" if v is None else fmt.format(v)

    eta = elapsed / max(step, 1) * (total - step)
    return (f"step {step}/{total} | {num('throughput/samples_per_s', '{:.1f}')} samples/s | "
            f"reward {num('reward/mean')} | eval {num('eval/accuracy')} | "
            f"stale {num('staleness/mean', '{:.1f}')}/{num('staleness/max', '{:.0f}')} | ETA {_fmt_eta(eta)}")


class Progress:
    def __init__(self, total_steps: int, mode: str = "auto", stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.total = total_steps
        self.live = mode == "bar" or (mode == "auto" and self.stream.isatty())
        self.start = time.monotonic()
        self.last_eval: float | None = None

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if metrics.get("eval/accuracy") is not None:
            self.last_eval = metrics["eval/accuracy"]
        m = dict(metrics)
        m.setdefault("eval/accuracy", self.last_eval)
        line = format_line(step, self.total, m, time.monotonic() - self.start)
        if self.live:
            self.stream.write("\r\x1b[2K" + line)
        else:
            self.stream.write(time.strftime("%H:%M:%S ") + line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """A log line that does not clobber the live line."""
        self.stream.write(("\n" if self.live else "") + text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()
