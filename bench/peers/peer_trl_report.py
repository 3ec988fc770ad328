"""The arithmetic and the table of `bench/peers/peer_trl.py` (ours vs TRL's GRPOTrainer), kept pure so that
tests/bench/test_peer_trl.py checks it on hand-made curves without TRL, vLLM or a run.

A run is read as a curve of evaluations: (step, samples consumed, training seconds, held-out accuracy)
with `bench.common.runs.sample_curve` -- both runs write metrics.jsonl rows of the same layout, and training
seconds are the loop's wall clock with every in-loop evaluation taken out (`bench.common.runs.training_clock`).

- samples/s: samples consumed / training seconds over the whole loop (evaluations left out).
- accuracy at x (samples or seconds): linear interpolation between the two evaluations around x; None
  outside the evaluated range (never extrapolated).
- time to an accuracy: the first crossing of the curve, interpolated linearly inside the interval where
  it first reaches the target; None when it never does (the table says "not reached").
- equal samples / equal wall time: x = the smaller of the two runs' totals, so both curves cover it.
- start-up: process start -> training loop start, minus the evaluation before RL (reported apart);
  "from process start" figures add it to a training time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from bench.common.runs import cumulative_samples, fmt, markdown_table, sample_curve, training_clock

Point = tuple[float, float]


def run_curve(rows: Sequence[dict], steps: int) -> dict:
    """{curve, samples, train_s, samples_per_s, acc_before, acc_final} of one run's merged rows."""
    curve = sample_curve(rows, steps)
    samples, clock = cumulative_samples(rows)[steps], training_clock(rows)[steps]
    last = curve[-1]
    return {"curve": curve, "samples": samples, "train_s": clock,
            "samples_per_s": samples / clock if clock > 0 else None,
            "acc_before": curve[0]["accuracy"], "acc_final": last["accuracy"] if last["step"] == steps else None}


def points(curve: Sequence[dict], x: str) -> list[Point]:
    """(x, accuracy) of every evaluation; x is "samples" or "train_s"."""
    return [(float(c[x]), float(c["accuracy"])) for c in curve]


def interpolate(pts: Sequence[Point], x: float) -> float | None:
    """Accuracy at `x` on the polyline through `pts` (sorted by x); None outside [x_first, x_last]."""
    if not pts or x < pts[0][0] - 1e-9 or x > pts[-1][0] + 1e-9:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 - 1e-9 <= x <= x1 + 1e-9:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def time_to_reach(pts: Sequence[Point], target: float) -> float | None:
    """First x at which the polyline reaches `target` (linear inside the crossing interval); None if never."""
    if not pts:
        return None
    if pts[0][1] >= target:
        return pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y1 >= target:
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    return None


def loop_start(lines: Sequence[tuple[float, str]], wall_s_step1: float) -> float | None:
    """Epoch time our training loop started: the time the driver printed step 1's line minus that step's
    `time/wall_s` (seconds since the loop started, read just before the line is printed)."""
    for t, text in lines:
        if re.search(r"\bstep 1/\d+\b", text):
            return t - wall_s_step1
    return None


def startup_s(process_start: float, loop_start_t: float | None, pre_eval_s: float | None) -> float | None:
    """Process start -> training loop start, the evaluation before RL left out."""
    if loop_start_t is None:
        return None
    return loop_start_t - process_start - (pre_eval_s or 0.0)


def compare(ours: dict, trl: dict) -> dict:
    """The comparison's figures; `ours`/`trl` are `run_curve` dicts, optionally with `startup_s`."""
    out = {"samples_per_s": (ours["samples_per_s"], trl["samples_per_s"])}
    a, b = ours["samples_per_s"], trl["samples_per_s"]
    out["throughput_ratio"] = a / b if a and b else None
    out["acc_final"] = (ours["acc_final"], trl["acc_final"])
    t_o, t_t = points(ours["curve"], "train_s"), points(trl["curve"], "train_s")
    # wall time (training clock) for each run to reach the OTHER run's final accuracy
    out["time_to_other_final"] = (
        time_to_reach(t_o, trl["acc_final"]) if trl["acc_final"] is not None else None,
        time_to_reach(t_t, ours["acc_final"]) if ours["acc_final"] is not None else None)
    out["time_to_own_final"] = (ours["train_s"], trl["train_s"])
    # the same from process start: start-up + training time (evaluations still left out)
    out["time_to_other_final_e2e"] = tuple(
        st + t if st is not None and t is not None else None
        for st, t in zip((ours.get("startup_s"), trl.get("startup_s")), out["time_to_other_final"]))
    s = min(ours["samples"], trl["samples"])
    s_o, s_t = points(ours["curve"], "samples"), points(trl["curve"], "samples")
    out["equal_samples"] = (s, interpolate(s_o, s), interpolate(s_t, s))
    w = min(ours["train_s"], trl["train_s"])
    out["equal_wall"] = (w, interpolate(t_o, w), interpolate(t_t, w))
    out["startup_s"] = (ours.get("startup_s"), trl.get("startup_s"))
    out["pre_eval_s"] = (ours.get("pre_eval_s"), trl.get("pre_eval_s"))
    return out


def _pair(pair, spec: str, unit: str = "", missing: str = "–") -> tuple[str, str]:
    return tuple(fmt(v, spec, missing) + (unit if v is not None else "") for v in pair)


def render(cmp: dict, ours_actors: int | None = None) -> str:
    """The markdown table: one row per figure, a column per system, the ratio or difference last
    (`ours_actors`: our run's actor count, said in its column's head)."""
    def ratio(a, b):
        return fmt(a / b if a is not None and b else None, ".2f")

    def diff(a, b):
        return fmt(a - b if a is not None and b is not None else None, "+.3f")

    sps = cmp["samples_per_s"]
    rows = [["samples/s over the training loop (evaluations excluded)", *_pair(sps, ".1f"),
             f"ours/TRL {ratio(*sps)}"]]
    acc = cmp["acc_final"]
    rows.append(["held-out accuracy at the end (greedy)", *_pair(acc, ".3f"), f"ours−TRL {diff(*acc)}"])
    own, other = cmp["time_to_own_final"], cmp["time_to_other_final"]
    rows.append(["training time to its own final accuracy (= whole loop)", *_pair(own, ".0f", " s"),
                 f"ours/TRL {ratio(*own)}"])
    reach = tuple("not reached" if v is None else f"{v:.0f} s" for v in other)
    rows.append(["training time to reach the other's final accuracy", *reach, ""])
    reach = tuple("not reached" if v is None else f"{v:.0f} s" for v in cmp["time_to_other_final_e2e"])
    rows.append(["same, counted from process start (start-up + training)", *reach, ""])
    s, ao, at = cmp["equal_samples"]
    rows.append([f"accuracy at equal samples ({s:.0f})", fmt(ao), fmt(at), f"ours−TRL {diff(ao, at)}"])
    w, ao, at = cmp["equal_wall"]
    rows.append([f"accuracy at equal training time ({w:.0f} s)", fmt(ao), fmt(at), f"ours−TRL {diff(ao, at)}"])
    st = cmp["startup_s"]
    rows.append(["start-up: process start → first training step (pre-RL eval excluded)",
                 *_pair(st, ".0f", " s"), f"ours/TRL {ratio(*st)}"])
    rows.append(["evaluation before RL (200 prompts, greedy)", *_pair(cmp["pre_eval_s"], ".1f", " s"), ""])
    actors = "" if ours_actors is None else f", {ours_actors} actor{'s' if ours_actors != 1 else ''}"
    return markdown_table(["figure", f"ours (algo-train, async{actors})", "TRL GRPOTrainer (sync, colocate)",
                           "ratio / Δ"], rows)


def is_finite(x) -> bool:
    return x is not None and math.isfinite(x)
