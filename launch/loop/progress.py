"""The live progress line: one self-overwriting line on a terminal, plain log lines elsewhere.

  step 12/60 | 41.3 samples/s | reward 0.53 | eval 0.61 | stale 0.8/2 | ETA 3m12s

The ETA counts training only: it is the time per step measured since the first step this process
reported (start-up — model preparation, Ray, vLLM engines, the evaluation before RL — and, on a resume,
the steps trained before it are not in it), times the steps left; "?" until two steps were seen.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def fmt_duration(seconds: float | None) -> str:
    """'1h02m', '3m12s', or '?' for unknown/non-finite."""
    if seconds is None or seconds != seconds or seconds in (float("inf"), float("-inf")) or seconds < 0:
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def format_line(step: int, total: int, m: dict[str, Any], elapsed: float, done: int | None = None) -> str:
    """The progress line; ETA = elapsed / done × (total − step), done = steps timed by `elapsed`
    (default: all `step` of them); done = 0 gives '?'."""
    def num(key: str, fmt: str = "{:.2f}") -> str:
        v = m.get(key)
        return "-" if v is None else fmt.format(v)

    done = step if done is None else done
    eta = elapsed / done * (total - step) if done > 0 else None
    return (f"step {step}/{total} | {num('throughput/samples_per_s', '{:.1f}')} samples/s | "
            f"reward {num('reward/mean')} | eval {num('eval/accuracy')} | "
            f"stale {num('staleness/mean', '{:.1f}')}/{num('staleness/max', '{:.0f}')} | ETA {fmt_duration(eta)}")


class Progress:
    def __init__(self, total_steps: int, mode: str = "auto", stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.total = total_steps
        self.live = mode == "bar" or (mode == "auto" and self.stream.isatty())
        self.start = time.monotonic()
        self.first: tuple[int, float] | None = None  # (step, time) of the first update: the ETA's origin
        self.last_eval: float | None = None

    def elapsed(self) -> float:
        """Seconds since this Progress was made (the run process's start-up included)."""
        return time.monotonic() - self.start

    def training_s(self) -> float:
        """Seconds since the first step was reported (0 before it)."""
        return 0.0 if self.first is None else time.monotonic() - self.first[1]

    def update(self, step: int, metrics: dict[str, Any], every: int = 1) -> None:
        """Show step `step`; a plain (non-terminal) stream gets a line every `every` steps and at the last."""
        now = time.monotonic()
        if self.first is None:
            self.first = (step, now)
        if metrics.get("eval/accuracy") is not None:
            self.last_eval = metrics["eval/accuracy"]
        if not self.live and step % every and step != self.total:
            return
        m = dict(metrics)
        m.setdefault("eval/accuracy", self.last_eval)
        line = format_line(step, self.total, m, now - self.first[1], done=step - self.first[0])
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
