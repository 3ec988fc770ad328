"""Training metrics over a run, for the evidence studies that name `traces` (bench/evidence/evidence.py).

A trace is one per-step training metric of metrics.jsonl (e.g. `pure/process_return`, `prime/dpo_acc`).
Per run it is cut into windows of the study's evaluation period (steps (e − w, e] for e = w, 2w, …) and
each window averaged; per arm the window means are averaged over seeds, with their standard error
(sd / √seeds). The table sets the first window beside the last, and the change between them paired by
seed; the plot draws every window.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.stats import mean_se  # noqa: E402


def windows(trace: dict[int, float], steps: int, width: int) -> dict[int, float]:
    """{window end e: mean of the trace over steps (e − width, e]} for e = width, 2·width, … ≤ steps; a window
    without a value is left out."""
    out = {}
    for end in range(width, steps + 1, width):
        vals = [v for s, v in trace.items() if end - width < s <= end]
        if vals:
            out[end] = statistics.fmean(vals)
    return out


def run_windows(rec: dict, key: str, steps: int, width: int) -> dict[int, float]:
    return windows(rec.get("traces", {}).get(key, {}), steps, width)


def trace_rows(arms: Sequence[str], by_arm: dict[str, list[dict]], keys: Sequence[str], steps: int,
               width: int) -> list[list[str]]:
    """Table rows (arm, metric, seeds, first window, last window, last − first paired by seed) of every arm
    and trace that some finished run of the arm logged."""
    rows = []
    for arm in arms:
        ok = [r for r in by_arm.get(arm, []) if r["status"] == "ok"]
        for key in keys:
            per = [w for w in (run_windows(r, key, steps, width) for r in ok) if w]
            if not per:
                continue
            first, last = min(per[0]), max(per[0])
            a, b = mean_se([w.get(first) for w in per]), mean_se([w.get(last) for w in per])
            d = mean_se([w[last] - w[first] for w in per if first in w and last in w])
            rows.append([arm, f"`{key}`", str(len(per)), f"{pm(a)} (steps 1–{first})",
                         f"{pm(b)} (steps {last - width + 1}–{last})", pm(d, signed=True)])
    return rows


def pm(ms: tuple, signed: bool = False) -> str:
    """'mean ± SE' to 3 decimals (the mean with its sign when `signed`); '–' without a mean."""
    mean, se = ms
    if mean is None:
        return "–"
    return f"{mean:{'+' if signed else ''}.3f}" + (f" ± {se:.3f}" if se is not None else "")


def draw_traces(axes, arms: Sequence[str], by_arm: dict[str, list[dict]], keys: Sequence[str], steps: int,
                width: int) -> None:
    """One panel per trace in `axes`: each arm's window means over seeds ± SE against the learner step, each arm
    in its own colour on every panel (a trace only one arm logs keeps that arm's colour)."""
    for ax, key in zip(axes, keys, strict=True):
        for i, arm in enumerate(arms):
            per = [w for w in (run_windows(r, key, steps, width) for r in by_arm.get(arm, [])
                               if r["status"] == "ok") if w]
            if not per:
                continue
            ends = sorted(set.intersection(*(set(w) for w in per)))
            stats = [mean_se([w[e] for w in per]) for e in ends]
            mean = [m for m, _ in stats]
            se = [s or 0.0 for _, s in stats]
            ax.plot(ends, mean, marker="o", ms=3, color=f"C{i}", label=f"{arm} ({len(per)} seeds)")
            ax.fill_between(ends, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)],
                            color=f"C{i}", alpha=0.15)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel(f"learner step (mean of {width}-step windows)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
