"""What the end-to-end benchmarks share (`bench/e2e/staleness.py`, `bench/e2e/learning.py`): running a real
`algo-train` as a subprocess, reading its `metrics.jsonl`, and the arithmetic both reports rest on.

Timing model of one run (launch/loop/driver.py): every training row k carries `time/wall_s`, the seconds
since the training loop started, read right after step k's weight push. The driver evaluates *after*
reading that clock, so an evaluation at step k lies inside the interval (wall_s[k-1], wall_s[k+1]]
of row k+1 — the same interval `throughput/samples_per_s` of row k+1 covers. Rows written before
`time/wall_s` existed fall back to interval_k = batch/rows ÷ throughput/samples_per_s (the same
quantity, rounded through a division). The evaluation before RL (step 0) runs before the loop clock
starts; a final evaluation after the loop is merged into the last step's row and lies in no interval.

The pure functions here are tested in tests/bench/test_runs.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from launch.loop.metrics import read_metrics  # noqa: E402

Row = dict
# algo-train's own progress lines (plain mode) and anything that looks like a failure; the rest of a run's
# output (Ray's prefixed worker chatter, vLLM loading bars, warnings) only goes to its log file
_ECHO = re.compile(r"^(\d\d:\d\d:\d\d step |\[[a-z]+\] |algo-train)|Traceback|Error|Exception|Killed")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log(msg: str) -> None:
    """Progress output (stderr; stdout is kept for the JSON lines)."""
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- running
@dataclass
class RunResult:
    name: str
    run_dir: Path
    log_path: Path
    status: str  # "ok", "reused" (an existing finished run, analysed again) or "failed"
    rc: int | None = None
    seconds: float | None = None  # end to end, start-up included
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "reused")


def algo_train_command(algo: str, run_dir: Path, overrides: Sequence[str], config: str | None = None) -> list[str]:
    """The `algo-train` command line of one run (the venv's console script when present); `config`: a
    `--config` file laid over configs/<algo>.yaml."""
    exe = Path(sys.executable).with_name("algo-train")
    head = [str(exe)] if exe.is_file() else [sys.executable, "-m", "launch.cli"]
    sets = [arg for o in overrides for arg in ("--set", o)]
    return [*head, "--algo", algo, *(["--config", config] if config else []), "--output", str(run_dir), *sets,
            "--set", "logging.progress=plain"]


def finished(run_dir: Path) -> bool:
    """True when `run_dir` holds a run that reached its last step (summary.json, not stopped early)."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return False
    try:
        return not json.loads(path.read_text()).get("stopped_early", True)
    except (ValueError, OSError):
        return False


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


def _stop(proc: subprocess.Popen, echo: Callable[[str], None]) -> None:
    """algo-train's own protocol: 1st SIGTERM = graceful stop (drain, checkpoint), 2nd = abort, 3rd =
    kill its whole session."""
    for grace in (180, 60, 30):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            echo(f"still running after {grace} s; signalling again")
    proc.kill()
    proc.wait()


def run_algo_train(name: str, algo: str, run_dir: Path, overrides: Sequence[str], log_path: Path,
                   timeout_s: float | None = None, reuse: bool = False, echo: str = "progress",
                   config: str | None = None) -> RunResult:
    """Run one `algo-train` to completion, its stdout+stderr into `log_path`, echoed to stderr prefixed
    by `name` (`echo`: "all", "progress" = algo-train's own lines and errors, or "none"). With `reuse`, start nothing: a finished run in `run_dir` is `reused`, anything
    else `failed`. Never raises for a failed run: the result says `failed` and why."""
    run_dir, log_path = Path(run_dir).resolve(), Path(log_path).resolve()
    res = RunResult(name, run_dir, log_path, "failed")
    if reuse:  # analyse only: never start a run
        if finished(run_dir):
            res.status = "reused"
            log(f"[{name}] reusing the finished run in {run_dir}")
        else:
            res.error = f"--reuse: no finished run in {run_dir} (--reuse starts no run)"
        return res
    if (run_dir / "metrics.jsonl").exists():
        res.error = (f"{run_dir} already holds a {'finished' if finished(run_dir) else 'partial'} run; "
                     "pass --reuse to analyse finished runs, or choose another --out-dir")
        return res
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = algo_train_command(algo, run_dir, overrides, config)
    env = dict(os.environ, RAY_DEDUP_LOGS="1", PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    with open(log_path, "w") as logf:
        logf.write("$ " + shlex.join(cmd) + "\n")
        logf.flush()
        # same process group: a terminal Ctrl-C reaches algo-train too, and its supervisor stops cleanly
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                logf.write(line)
                logf.flush()
                text = _ANSI.sub("", line).rstrip()
                if text and (echo == "all" or (echo == "progress" and _ECHO.search(text))):
                    log(f"  [{name}] {text}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            res.rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log(f"[{name}] over the {timeout_s:.0f} s limit; stopping it")
            _stop(proc, lambda m: log(f"[{name}] {m}"))
            res.rc, res.error = proc.returncode, f"timed out after {timeout_s:.0f} s"
        except KeyboardInterrupt:
            log(f"[{name}] interrupted: waiting for algo-train to stop cleanly (Ctrl-C again to abort it)")
            with contextlib.suppress(KeyboardInterrupt):
                proc.wait()
            raise
        finally:
            reader.join(timeout=30)
    res.seconds = time.monotonic() - t0
    if res.rc == 0 and not res.error:
        res.status = "ok"
    elif not res.error:
        res.error = f"algo-train exited with status {res.rc}"
    return res


def run_stamped(cmd: list[str], log_path: Path, timeout_s: float, name: str,
                env: dict[str, str] | None = None) -> tuple[int, float]:
    """Run `cmd` (with the variables `env` added to this environment), each output line written to `log_path`
    as '<epoch seconds> <line>' (and algo-train's own progress lines echoed); returns (exit status, epoch
    time of the start). `stamped_lines` reads the file back."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="1", **(env or {}))
    t0 = time.time()
    with open(log_path, "w") as f:
        f.write(f"{t0:.3f} $ {shlex.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)

        def pump():
            for line in proc.stdout:
                f.write(f"{time.time():.3f} {line}")
                f.flush()
                if line.startswith("[") or " step " in line[:20] or "Error" in line or "Traceback" in line:
                    log(f"  [{name}] {line.rstrip()[:200]}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            rc = proc.wait()
            log(f"[{name}] stopped after the {timeout_s:.0f} s limit")
        reader.join(timeout=30)
    return rc, t0


def stamped_lines(log_path: Path) -> list[tuple[float, str]]:
    """(epoch seconds, line) of a `run_stamped` log."""
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        t, _, text = line.partition(" ")
        try:
            out.append((float(t), text))
        except ValueError:
            continue
    return out


def report_failure(res: RunResult, lines: int = 40) -> None:
    if not res.log_path.is_file():  # nothing was started (e.g. --reuse found no run)
        log(f"[{res.name}] FAILED: {res.error}")
        return
    log(f"[{res.name}] FAILED: {res.error}\n--- last {lines} lines of {res.log_path} ---\n"
        f"{tail(res.log_path, lines)}\n--- end of log ---")


def run_and_analyse(rec: dict, name: str, algo: str, overrides: Sequence[str], args,
                    analyse: Callable[[list[Row]], dict], config: str | None = None) -> RunResult:
    """Run (or, with --reuse, find) one benchmark run into `args.out_dir/name` and fill `rec` with its
    status, timings, machine load and `analyse(rows)`; a failed or unreadable run is marked failed
    in `rec` and its log tail printed."""
    log_path = args.out_dir / (name + ".log")
    rec |= {"run_dir": str(args.out_dir / name), "log": str(log_path), "load_before": load_average()}
    res = run_algo_train(name, algo, args.out_dir / name, overrides, log_path, timeout_s=args.timeout_s,
                         reuse=args.reuse, echo=args.echo, config=config)
    rec |= {"status": res.status, "run_s": res.seconds, "load_after": load_average()}
    if res.status == "reused":  # the load now says nothing about when that run ran
        rec["load_before"] = rec["load_after"] = None
    if res.ok:
        try:
            rec |= analyse(load_rows(res.run_dir))
            rec["status"] = "ok"
        except (ValueError, KeyError, FileNotFoundError, ZeroDivisionError) as e:
            res.status, res.error = "failed", f"unreadable metrics: {e}"
    if not res.ok:
        rec |= {"status": "failed", "error": res.error}
        report_failure(res)
    return res


def check_extras(extras: Iterable[str], reserved: dict[str, str]) -> list[str]:
    """`--extra KEY=VALUE` list, checked for form and for keys the benchmark sets itself."""
    out = []
    for text in extras:
        key, sep, _ = text.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--extra {text!r}: expected KEY=VALUE, e.g. --extra rollout.n=4")
        if key.strip() in reserved:
            raise ValueError(f"--extra {text!r}: the benchmark sets {key.strip()} itself — use {reserved[key.strip()]}")
        out.append(text)
    return out


def add_run_options(p, name: str) -> None:
    """The options every end-to-end benchmark shares: overrides, folders, limits, re-analysis, echo."""
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE",
                   help="config override passed to every run (repeatable)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help=f"folder of the run folders and their logs (default runs/bench-{name}-<time>)")
    p.add_argument("--table", type=Path, default=ROOT / "bench" / f"{name}_results.md",
                   help="markdown file for the results table")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per-run limit (stopped cleanly after it)")
    p.add_argument("--reuse", action="store_true",
                   help="start no run: only analyse the finished runs in --out-dir (missing ones are reported "
                        "as failed)")
    p.add_argument("--echo", choices=["progress", "all", "none"], default="progress",
                   help="what of each run's output to echo to stderr (all of it is in the run's log file)")


def finish_run_options(p, args, name: str, reserved: dict[str, str]):
    """Validate --extra against the keys the benchmark sets itself; default --out-dir."""
    try:
        args.extra = check_extras(args.extra, reserved)
    except ValueError as e:
        p.error(str(e))
    if args.out_dir is None:
        args.out_dir = ROOT / "runs" / f"bench-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return args


def machine() -> dict:
    info = {"cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    return info


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------------------------------------- metrics
def load_rows(run_dir: Path) -> list[Row]:
    """metrics.jsonl rows merged by step (the final evaluation joins its step's row), in step order."""
    return merge_rows(read_metrics(run_dir))


def merge_rows(rows: Iterable[Row]) -> list[Row]:
    merged: dict[int, Row] = {}
    for r in rows:
        merged.setdefault(int(r["step"]), {}).update(r)
    return [merged[k] for k in sorted(merged)]


def training_rows(rows: Sequence[Row]) -> list[Row]:
    """Rows of optimiser steps (step ≥ 1 with a learner time), in step order."""
    return [r for r in rows if r.get("step", 0) >= 1 and r.get("time/train_s") is not None]


def eval_steps(rows: Sequence[Row]) -> set[int]:
    """Steps ≥ 1 after which an evaluation ran inside the loop (its time lies in the next interval)."""
    return {int(r["step"]) for r in rows if r.get("step", 0) >= 1 and r.get("time/eval_s") is not None}


def step_seconds(train: Sequence[Row]) -> dict[int, float]:
    """Wall-clock interval of each training row, evaluations inside it included (module docstring)."""
    out, prev = {}, 0.0
    for r in train:
        w = r.get("time/wall_s")
        if w is not None:
            out[int(r["step"])], prev = w - prev, w
        else:
            dt = r["batch/rows"] / r["throughput/samples_per_s"]
            out[int(r["step"])], prev = dt, prev + dt
    return out


def training_clock(rows: Sequence[Row]) -> dict[int, float]:
    """Seconds of training wall-clock at each step (0 at step 0), evaluation time left out: the sum of
    the step intervals minus every in-loop evaluation that lies inside them."""
    ev = {int(r["step"]): r["time/eval_s"] for r in rows
          if r.get("step", 0) >= 1 and r.get("time/eval_s") is not None}
    train = training_rows(rows)
    dt = step_seconds(train)
    clock, t = {0: 0.0}, 0.0
    for r in train:
        k = int(r["step"])
        t += dt[k] - ev.get(k - 1, 0.0)
        clock[k] = t
    return clock


def cumulative_samples(rows: Sequence[Row]) -> dict[int, float]:
    """Samples the learner consumed up to each step (Σ batch/rows; 0 at step 0)."""
    out, total = {0: 0.0}, 0.0
    for r in training_rows(rows):
        total += r["batch/rows"]
        out[int(r["step"])] = total
    return out


@dataclass
class SteadyState:
    samples: float
    seconds: float
    steps: list[int] = field(default_factory=list)  # steps whose intervals were measured
    left_out: list[int] = field(default_factory=list)  # steps after the warm-up left out (evaluation inside)

    @property
    def samples_per_s(self) -> float | None:
        return self.samples / self.seconds if self.seconds > 0 else None


def steady_state(rows: Sequence[Row], skip: int, settle: int = 1) -> SteadyState:
    """Samples/s over the training steps after the first `skip`, leaving out the `settle` steps after
    every in-loop evaluation: the first of them holds the evaluation in its interval, and while actor 0
    evaluates the actors keep generating, so the following steps start with batches already waiting —
    up to K + 1 of them under max_staleness K, hence `settle` = K + 1 makes the window clean. Leaving
    steps out rather than subtracting `time/eval_s` is deliberate: subtracting would credit that head
    start to throughput."""
    train = training_rows(rows)
    dt = step_seconds(train)
    ev = eval_steps(rows)
    st = SteadyState(0.0, 0.0)
    for r in train:
        k = int(r["step"])
        if k <= skip:
            continue
        if any(k - j in ev for j in range(1, settle + 1)):
            st.left_out.append(k)
            continue
        st.steps.append(k)
        st.samples += r["batch/rows"]
        st.seconds += dt[k]
    return st


def mean_over(rows: Sequence[Row], key: str, steps: Iterable[int] | None = None) -> float | None:
    """Mean of `key` over the rows of `steps` (all rows when None), nulls skipped; None when empty."""
    want = None if steps is None else set(steps)
    vals = [r[key] for r in rows if r.get(key) is not None and (want is None or int(r["step"]) in want)]
    return statistics.fmean(vals) if vals else None


def max_over(rows: Sequence[Row], key: str, steps: Iterable[int] | None = None) -> float | None:
    want = None if steps is None else set(steps)
    vals = [r[key] for r in rows if r.get(key) is not None and (want is None or int(r["step"]) in want)]
    return max(vals) if vals else None


def eval_curve(rows: Sequence[Row]) -> list[tuple[int, float, int]]:
    """(step, eval/accuracy, eval/n) of every evaluation, step 0 (before RL) included."""
    return [(int(r["step"]), r["eval/accuracy"], int(r.get("eval/n") or 0)) for r in rows
            if r.get("eval/accuracy") is not None]


def sample_curve(rows: Sequence[Row], steps: int) -> list[dict]:
    """Every evaluation as {step, samples, train_s, accuracy, eval_n} — samples consumed and training seconds
    (`training_clock`) up to it — of a run that must hold exactly `steps` training rows and an evaluation
    before RL (step 0); ValueError otherwise."""
    train = training_rows(rows)
    if len(train) != steps:
        raise ValueError(f"metrics.jsonl holds {len(train)} training rows, expected {steps}")
    clock, samples = training_clock(rows), cumulative_samples(rows)
    curve = [{"step": s, "samples": samples[s], "train_s": clock[s], "accuracy": acc, "eval_n": n}
             for s, acc, n in eval_curve(rows)]
    if not curve or curve[0]["step"] != 0:
        raise ValueError("no evaluation before RL (step 0) in metrics.jsonl")
    return curve


def accuracy_at(rows: Sequence[Row], step: int) -> tuple[float | None, int]:
    for s, acc, n in eval_curve(rows):
        if s == step:
            return acc, n
    return None, 0


# ---------------------------------------------------------------------------------------------- arithmetic
def ideal_bound(t_gen: float, t_train: float) -> float:
    """Throughput of perfect overlap over strictly alternating phases: (T_gen + T_train) / max(both)."""
    longest = max(t_gen, t_train)
    if longest <= 0:
        raise ValueError(f"ideal_bound: both phases are empty (T_gen={t_gen}, T_train={t_train})")
    return (t_gen + t_train) / longest


def ideal_bound_sync_serial(t_gen: float, t_train: float, t_sync: float) -> float:
    """The bound when the weight push stalls both sides (engines pause to load weights), so it cannot
    overlap anything: (T_gen + T_train + T_sync) / (max(T_gen, T_train) + T_sync). T_train excludes
    T_sync here."""
    return (t_gen + t_train + t_sync) / (max(t_gen, t_train) + t_sync)


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def steps_for_samples(samples: int, samples_per_step: int) -> int:
    """Optimiser steps that consume at least `samples` samples (whole steps; at least one)."""
    if samples_per_step <= 0:
        raise ValueError(f"samples per step must be positive, got {samples_per_step}")
    return max(1, math.ceil(samples / samples_per_step))


# ---------------------------------------------------------------------------------------------- output
def fmt(value, spec: str = ".3f", missing: str = "–") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return format(value, spec)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def rounded(obj):
    """JSON-friendly copy with floats rounded to 5 significant digits."""
    if isinstance(obj, float):
        return float(f"{obj:.5g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: rounded(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [rounded(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj
