"""Two settings of one run, A against B, alternated on the same machine: steady-state samples/s of each
(`bench.common.runs.steady_state`) and their ratio, pair by pair. This machine's speed drifts with other jobs,
so every pair runs A then B back to back, and the ratio is taken within the pair; the median of the
pairs' ratios is the result. Also reported per run: where the learner's time went (waiting for a batch
against training, `time/generate_wait_s` and `time/train_s`), the held-out accuracy at the end, and
where its CPU went: CPU seconds a step by role over the middle of the run (`bench.common.cpu_roles`, steps
--cpu-steps), which says which side of a change did less work when the machine's speed drifts.

    .venv/bin/python bench/e2e/ab.py --a rollout.prompts_in_flight=8 --b rollout.prompts_in_flight=16 --steps 150 --pairs 2

One JSON line per run on stdout; progress and the table on stderr; the table and the command are also appended to
`--table` (default bench/ab_results.md). The pure part (`summarise`) is tested in tests/bench/test_ab.py.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.cpu_roles import CpuWindow  # noqa: E402
from bench.common.runs import (  # noqa: E402
    add_run_options,
    finish_run_options,
    fmt,
    log,
    machine,
    markdown_table,
    run_and_analyse,
    steady_state,
    training_rows,
)


def analyse(rows: list[dict], skip: int) -> dict:
    st = steady_state(rows, skip, settle=2)
    train = training_rows(rows)
    evals = [r for r in rows if "eval/accuracy" in r]
    return {"samples_per_s": st.samples_per_s, "steady_steps": len(st.steps),
            "wait_s": sum(r.get("time/generate_wait_s", 0.0) for r in train),
            "train_s": sum(r.get("time/train_s", 0.0) for r in train),
            "accuracy_end": evals[-1]["eval/accuracy"] if evals else None}


def summarise(records: list[dict]) -> dict:
    """Ratio B/A of each complete pair (both runs ok), their median, and each side's mean samples/s."""
    pairs = {}
    for r in records:
        if r["status"] == "ok" and r.get("samples_per_s"):
            pairs.setdefault(r["pair"], {})[r["side"]] = r["samples_per_s"]
    ratios = [p["b"] / p["a"] for _, p in sorted(pairs.items()) if {"a", "b"} <= p.keys()]
    mean = {s: statistics.fmean(v) if (v := [p[s] for p in pairs.values() if s in p]) else None for s in "ab"}
    return {"ratios": ratios, "median_ratio": statistics.median(ratios) if ratios else None,
            "mean_a": mean["a"], "mean_b": mean["b"]}


def cpu_cell(cpu: dict) -> str:
    """'0.62 / 0.32 / 0.15 / 1.17 (1.55)' from a `CpuWindow.result` ('–' when the window was not read)."""
    if not cpu:
        return "–"
    split = cpu["cpu_s_per_step"]
    parts = [fmt(split.get(role, 0.0), ".2f") for role in ("engine", "learner", "actor")]
    return f"{' / '.join(parts)} / {sum(split.values()):.2f} ({cpu['cores_busy']:.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--a", action="append", required=True, metavar="KEY=VALUE", help="setting A (repeatable)")
    p.add_argument("--b", action="append", required=True, metavar="KEY=VALUE", help="setting B (repeatable)")
    p.add_argument("--algo", default="grpo")
    p.add_argument("--steps", type=int, default=150, help="learner steps of every run")
    p.add_argument("--pairs", type=int, default=2, help="A-then-B pairs")
    p.add_argument("--skip-steps", type=int, default=5, help="first steps left out of the steady state")
    p.add_argument("--cpu-steps", type=int, nargs=2, default=None, metavar=("FIRST", "LAST"),
                   help="training steps between which CPU is read by role (default: a quarter to five sixths of --steps)")
    add_run_options(p, "ab")
    args = finish_run_options(p, p.parse_args(argv), "ab", {"steps": "--steps"})
    first, last = args.cpu_steps or (args.steps // 4, args.steps * 5 // 6)
    records = []
    for pair in range(args.pairs):
        for side, sets in (("a", args.a), ("b", args.b)):
            name = f"{side}{pair}"
            rec = {"bench": "ab", "pair": pair, "side": side, "settings": sets}
            overrides = [f"learner.steps={args.steps}", *sets, *args.extra]
            window = CpuWindow(args.out_dir / name, first, last)
            window.start()
            run_and_analyse(rec, name, args.algo, overrides, args, lambda rows: analyse(rows, args.skip_steps))
            window.stop()
            window.join()
            rec["cpu"] = window.result
            print(json.dumps(rec), flush=True)
            log(f"[ab] {name} ({' '.join(sets)}): {fmt(rec.get('samples_per_s'), '.1f')} samples/s, "
                f"waited {fmt(rec.get('wait_s'), '.0f')} s, trained {fmt(rec.get('train_s'), '.0f')} s")
            records.append(rec)
    s = summarise(records)
    table = markdown_table(
        ["run", "settings", "samples/s (steady)", "learner waited s", "learner trained s", "accuracy end",
         f"CPU-s a step, steps {first}-{last}: engines / learner / actors / all (cores busy)", "load before/after"],
        [[f"{r['side'].upper()}{r['pair']}", " ".join(r["settings"]), fmt(r.get("samples_per_s"), ".1f"),
          fmt(r.get("wait_s"), ".0f"), fmt(r.get("train_s"), ".0f"), fmt(r.get("accuracy_end")), cpu_cell(r["cpu"]),
          f"{fmt(r.get('load_before'), '.1f')}/{fmt(r.get('load_after'), '.1f')}"] for r in records])
    verdict = (f"B/A samples/s per pair: {', '.join(f'{x:.2f}' for x in s['ratios'])}; median "
               f"{fmt(s['median_ratio'], '.2f')} (A {fmt(s['mean_a'], '.1f')}, B {fmt(s['mean_b'], '.1f')} mean)")
    m = machine()
    text = (f"Command: `python bench/e2e/ab.py {shlex.join(argv if argv is not None else sys.argv[1:])}` "
            f"({m.get('cpu', '?')}, {m.get('cpus', '?')} CPUs)\n\n{table}\n\n{verdict}\n")
    log(text)
    with open(args.table, "a") as f:
        f.write("\n" + text)
    return 0 if s["ratios"] else 1


if __name__ == "__main__":
    sys.exit(main())
