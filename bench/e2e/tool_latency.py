"""Async where it pays: samples/s of this system against its synchronous loop, with a tool that waits L seconds.

    python bench/e2e/tool_latency.py [--latencies 0 0.25 1] [--steps 16] [--skip 4] [--out-dir DIR] [--reuse]
                                 [--set key=value ...]

One run of this script starts, for each L, three `algo-train --algo grpo` runs of the quick-start's tiny model with
multi-turn rollouts (`env.environment=bench/e2e/sleep_env.py:Sleep<L>`: every trajectory waits L seconds of wall
time, asleep, between its two turns) and nothing else changed but:

  async       buffer.max_staleness as configs/grpo.yaml has it (auto: K from 1 to 4 chosen from measured times)
              and 16 prompts in flight
  async-wide  K = 4 from the start and 40 prompts in flight, the most the credit of K = 4 allows
              ((K + 1) × learner.batch_prompts): a trajectory asleep holds no engine slot (each turn is its
              own request), so with a slow tool more prompts in flight is cheap
  sync        --max-staleness 0: no prompt starts until the learner holds the version it is generated under, so
              generation never overlaps training or a weight push. It is this system's synchronous loop, not
              a serial one: within a step, the batch's prompts (and each prompt's n trajectories) still
              generate concurrently on the engine, and their tool waits overlap one another (as in veRL's
              and TRL's synchronous trainers, whose rollout phase is batched too).

samples/s: rows trained over the training seconds of the steps after the first `--skip` (`bench.runs.
steady_state`: the engine start, the first steps and any evaluation are left out; evaluations are off here).
The table (markdown, also written to DIR/tool_latency.md) gives both and their ratio per L. A ratio is
measured within this one run of the script, on one machine; the absolute rates depend on its load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import (  # noqa: E402
    fmt,
    load_rows,
    log,
    machine,
    markdown_table,
    ratio,
    run_algo_train,
    steady_state,
)

ENVS = {0.0: "Sleep0", 0.25: "Sleep025", 1.0: "Sleep1"}  # bench/e2e/sleep_env.py
MODES = {"async": [], "async-wide": ["buffer.max_staleness=4", "rollout.prompts_in_flight=40"],
         "sync": ["buffer.max_staleness=0"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latencies", type=float, nargs="+", default=sorted(ENVS), help="tool wall times L, seconds "
                   f"(of {', '.join(f'{x:g}' for x in ENVS)})")
    p.add_argument("--steps", type=int, default=16, help="learner steps per run")
    p.add_argument("--skip", type=int, default=4, help="first steps left out of samples/s")
    p.add_argument("--out-dir", default="bench_runs/tool_latency", help="run folders, logs and the table")
    p.add_argument("--reuse", action="store_true", help="analyse the finished runs in --out-dir, start none")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run at most")
    p.add_argument("--set", dest="sets", action="append", default=[], help="extra key=value for every run")
    args = p.parse_args(argv)
    bad = [x for x in args.latencies if x not in ENVS]
    if bad:
        p.error(f"--latencies: {bad} has no environment in bench/e2e/sleep_env.py; choose among {sorted(ENVS)}")
    if args.skip >= args.steps:
        p.error("--skip must be below --steps")
    return args


def overrides(latency: float, mode: str, args: argparse.Namespace) -> list[str]:
    env = Path(__file__).with_name("sleep_env.py")
    return [f"env.environment={env}:{ENVS[latency]}", "env.max_turns=2", f"learner.steps={args.steps}",
            "learner.eval_every=0", "logging.samples_every=0", *MODES[mode], *args.sets]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out_dir)
    results: dict[tuple[float, str], dict] = {}
    for latency in args.latencies:
        for mode in MODES:
            name = f"L{latency:g}-{mode}"
            run_dir = out / name
            res = run_algo_train(name, "grpo", run_dir, overrides(latency, mode, args), out / f"{name}.log",
                                 timeout_s=args.timeout, reuse=args.reuse)
            if res.status == "failed":
                log(f"[{name}] failed: {res.error}")
                results[latency, mode] = {"status": "failed", "error": res.error}
                continue
            rows = load_rows(run_dir)
            st = steady_state(rows, args.skip)
            results[latency, mode] = {"status": res.status, "samples_per_s": st.samples_per_s,
                                      "steps": st.steps, "seconds": st.seconds, "samples": st.samples,
                                      "run_seconds": res.seconds}
            log(f"[{name}] {fmt(st.samples_per_s, '.2f')} samples/s over steps {st.steps[:1]}..{st.steps[-1:]}")
    def rate(x: float, mode: str) -> float | None:
        return results[x, mode].get("samples_per_s")

    table = markdown_table(
        ["tool wait L (s)", "async samples/s", "async-wide samples/s", "sync (--max-staleness 0) samples/s",
         "async / sync", "async-wide / sync"],
        [[f"{x:g}", *(fmt(rate(x, m), ".2f") for m in MODES),
          *(fmt(ratio(rate(x, m), rate(x, "sync")), ".2f") + "×" for m in ("async", "async-wide"))]
         for x in args.latencies])
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tool_latency.md").write_text(table + "\n")
    (out / "tool_latency.json").write_text(json.dumps(
        {"machine": machine(), "args": vars(args),
         "results": {f"L{x:g}-{m}": r for (x, m), r in results.items()}}, indent=1, default=str) + "\n")
    return 0 if all(r["status"] != "failed" for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
