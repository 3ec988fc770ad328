"""Start-up of the quick-start, vLLM's spawned engine core (A) against ours forked from the actor (B).

Each arm is a real one-step run, `algo-train --algo grpo --steps 1`, as a user starts it; A sets
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` (vLLM's own way inside a Ray actor, `actors/engine_fork.py`), B
leaves the default. The arms alternate, A then B per pair, because this machine's speed drifts with other
jobs; the ratio is taken within each pair. Times are seconds after the command, read from its output as it
arrives: the engines up, the pre-RL evaluation done (and its length, from metrics.jsonl), the first step.

    .venv/bin/python bench/e2e/startup.py --pairs 2            # ~4 min on a quiet 2-core machine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import algo_train_command, run_stamped, stamped_lines  # noqa: E402

MARKS = {"up": "vLLM actor(s) up in", "eval": "[eval] held-out accuracy before RL", "step": "step 1/1"}


def timed_run(out: Path, spawn: bool) -> dict:
    """Seconds after the command at which each of MARKS first appeared, and the evaluation's length."""
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"} if spawn else {}
    if not spawn and os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn":
        raise SystemExit("bench/e2e/startup.py: unset VLLM_WORKER_MULTIPROC_METHOD (arm B is the default)")
    log_path = out.with_suffix(".log")
    rc, t0 = run_stamped([*algo_train_command("grpo", out, []), "--steps", "1"], log_path, 900,
                         out.name, env=env)
    seen = {}
    for t, line in stamped_lines(log_path):
        for name, text in MARKS.items():
            if name not in seen and text in line:
                seen[name] = round(t - t0, 1)
    if rc != 0 or len(seen) < len(MARKS):
        raise SystemExit(f"bench/e2e/startup.py: the run in {out} failed (exit {rc}; saw {seen}; log {log_path})")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seen["eval_s"] = round(next(r["time/eval_s"] for r in rows if "time/eval_s" in r), 1)
    return seen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=2)
    args = p.parse_args(argv)
    print("| pair | arm | actors up | pre-RL evaluation done (its length) | first training step | load |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for pair in range(1, args.pairs + 1):
            got = {}
            for arm in ("spawn", "fork"):
                got[arm] = t = timed_run(Path(tmp) / f"{arm}{pair}", spawn=arm == "spawn")
                print(f"| {pair} | {arm} | {t['up']} | {t['eval']} ({t['eval_s']}) | {t['step']} | "
                      f"{os.getloadavg()[0]:.1f} |", flush=True)
            print(f"fork/spawn, engines up, pair {pair}: {got['fork']['up'] / got['spawn']['up']:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
