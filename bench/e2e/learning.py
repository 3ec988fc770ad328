"""Learning per sample and per second: every algorithm for the same sample budget, same seed.

Each algorithm (default grpo, rloo, prime, pure, luffy, pacs) runs once as a real `algo-train` with its
own configs/<algo>.yaml unchanged — asynchronous, K as configured there — except the seed, the number of
steps and the evaluation period. The budget `--samples N` is converted to optimiser steps per algorithm:
steps = ceil(N / (learner.batch_prompts × rollout.n)) from the resolved configuration, because every
step consumes exactly that many samples (rows). "Samples" are what the *learner consumes*:
- LUFFY's groups hold rollout.n rows of which `luffy.n_prefix` are demonstration rows (prefix ratio 1:
  the whole teacher solution, attached by the buffer, nothing generated), so with the shipped config 1 of
  every 8 rows is a teacher row; they count as samples because the learner trains on them.
- PRIME keeps only groups inside the accuracy window (buffer.filter); the groups filtered out were
  generated but are not consumed and do not count.
The reported samples are measured (Σ batch/rows), not assumed. The configs' learning-rate schedule
(10-step warm-up, cosine decay to 0 at learner.steps) is thereby fitted to the budget's steps.

Reported: one JSON line per algorithm on stdout, a markdown table (algo, steps, samples, training
wall-clock s, accuracy before RL, at the end, best, samples/s) and one PNG with two panels, held-out
greedy accuracy vs samples and vs training wall-clock seconds, one line per algorithm. Wall-clock is the
run's own: `time/wall_s` (seconds since the training loop started, docs/metrics.md) with the time of
every in-loop evaluation taken out, so the x axis is time spent training — start-up (Ray, vLLM engines,
SFT warm-up of the starting model, shared by all algorithms through the cache) is not in it and is
reported separately as run_s. Runs are sequential, so the machine's load drifts between algorithms:
compare wall-clock only with the load averages each JSON line records in mind; samples are exact.

Run (≈20–25 min on an otherwise idle 2-core machine: 50 steps each, ~2 min start-up per run):
  .venv/bin/python bench/e2e/learning.py --samples 3200 --eval-every 5
Re-analyse finished runs (new table/plot) without training: add `--reuse --out-dir DIR`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import (  # noqa: E402
    ROOT,
    add_run_options,
    cumulative_samples,
    finish_run_options,
    fmt,
    log,
    machine,
    markdown_table,
    mean_over,
    rounded,
    run_and_analyse,
    sample_curve,
    steps_for_samples,
    training_clock,
)

ALGOS = ["grpo", "rloo", "prime", "pure", "luffy", "pacs"]
RESERVED = {"seed": "--seed", "learner.steps": "--samples", "learner.eval_every": "--eval-every"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Run each algorithm for the same sample budget and seed; table + accuracy curves vs "
                    "samples and vs wall-clock. One JSON line per run on stdout.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algos", nargs="+", default=ALGOS, metavar="ALGO", help="algorithms, in run order")
    p.add_argument("--samples", type=int, default=3200,
                   help="samples the learner consumes per algorithm (rounded up to whole steps)")
    p.add_argument("--seed", type=int, default=0, help="top-level seed of every run")
    p.add_argument("--eval-every", type=int, default=5, metavar="N", help="learner.eval_every (steps)")
    add_run_options(p, "learning")
    p.add_argument("--plot", type=Path, default=ROOT / "bench" / "learning_curves.png", help="PNG of the curves")
    args = p.parse_args(argv)
    if args.samples <= 0:
        p.error("--samples must be positive")
    if args.eval_every <= 0:
        p.error("--eval-every must be positive (the curves need evaluations)")
    return finish_run_options(p, args, "learning", RESERVED)


def budget(cfg, samples: int) -> dict:
    """Steps and per-step counts of one algorithm's resolved config for a budget of `samples`."""
    per_step = cfg.learner.batch_prompts * cfg.rollout.n
    plan = {"batch_prompts": cfg.learner.batch_prompts, "n": cfg.rollout.n, "samples_per_step": per_step,
            "steps": steps_for_samples(samples, per_step)}
    if cfg.algo == "luffy":  # demonstration rows: guided rows whose prefix ratio is 1 (nothing generated)
        import random

        from algos.luffy.prefix import prefix_ratios_from_cfg

        rng = random.Random(0)
        draws = [prefix_ratios_from_cfg(cfg.luffy, cfg.rollout.n, 0, rng) for _ in range(64)]
        plan["demo_rows_per_group"] = statistics.fmean(sum(r >= 1.0 for r in d) for d in draws)
    return plan


def analyse(rows: list[dict], steps: int) -> dict:
    curve = sample_curve(rows, steps)
    clock, samples = training_clock(rows), cumulative_samples(rows)
    after = [c for c in curve if c["step"] >= 1]
    total_s = clock[steps]
    return {
        "samples": samples[steps], "train_s": total_s, "samples_per_s": samples[steps] / total_s if total_s else None,
        "accuracy_before": curve[0]["accuracy"],
        "accuracy_end": after[-1]["accuracy"] if after and after[-1]["step"] == steps else None,
        "accuracy_best": max((c["accuracy"] for c in after), default=None),
        "best_step": max(after, key=lambda c: c["accuracy"])["step"] if after else None,
        "reward_mean": mean_over(rows, "reward/mean"),
        "demo_row_frac": mean_over(rows, "luffy/offpolicy_row_frac"),
        "curve": curve,
    }


def plot(records: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for rec in records:
        if rec["status"] != "ok":
            continue
        xs_n = [c["samples"] for c in rec["curve"]]
        xs_t = [c["train_s"] for c in rec["curve"]]
        ys = [c["accuracy"] for c in rec["curve"]]
        axes[0].plot(xs_n, ys, marker="o", ms=3, label=rec["algo"])
        axes[1].plot(xs_t, ys, marker="o", ms=3, label=rec["algo"])
    axes[0].set_xlabel("samples consumed by the learner")
    axes[1].set_xlabel("training wall-clock s (evaluation excluded)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def render(args: argparse.Namespace, records: list[dict]) -> str:
    rows = []
    for r in records:
        if r["status"] != "ok":
            rows.append([r["algo"], str(r.get("steps", "–")), "–", "–", "–", "–", "–", "–", f"failed: {r['error']}"])
            continue
        best = fmt(r["accuracy_best"]) + (f" (step {r['best_step']})" if r["best_step"] is not None else "")
        rows.append([r["algo"], str(r["steps"]), fmt(r["samples"], ".0f"), fmt(r["train_s"], ".0f"),
                     fmt(r["accuracy_before"]), fmt(r["accuracy_end"]), best, fmt(r["samples_per_s"], ".1f"), "ok"])
    table = markdown_table(["algo", "steps", "samples", "wall-clock s", "acc before", "acc end", "best acc",
                            "samples/s", "status"], rows)
    m = machine()
    loads = [x for r in records for x in (r.get("load_before"), r.get("load_after")) if x is not None]
    notes = [f"### Learning at equal samples — {args.samples} samples, seed {args.seed}", "",
             f"Command: `.venv/bin/python bench/e2e/learning.py {shlex.join(sys.argv[1:])}`", "",
             f"Machine: {m.get('cpu', '?')}, {m['cpus']} cores, Python {m['python']}; 1-minute load average "
             f"{min(loads, default=0):.1f}–{max(loads, default=0):.1f} during the runs. Each algorithm runs its "
             f"own configs/<algo>.yaml; evaluation every {args.eval_every} steps (greedy, held-out). "
             f"Extra overrides: {', '.join(args.extra) or 'none'}. Samples = rows the learner consumed "
             "(Σ batch/rows); wall-clock = the training loop's own clock (`time/wall_s`) minus evaluation "
             "time; best acc = best evaluation after step 0.", "", table, ""]
    luffy = next((r for r in records if r["algo"] == "luffy" and r["status"] == "ok"), None)
    if luffy and luffy.get("demo_row_frac") is not None:
        notes.append(f"LUFFY: {luffy['demo_row_frac']:.3f} of its rows were teacher (demonstration) rows, counted in "
                     "its samples.")
    notes.append(f"Curves: `{args.plot}`.")
    return "\n".join(notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from configs.loading import ConfigError, resolve

    plans = {}
    try:  # every configuration validates before anything starts
        for algo in args.algos:
            cfg = resolve(algo, overrides=args.extra)
            plans[algo] = budget(cfg, args.samples)
            resolve(algo, overrides=overrides(args, plans[algo]["steps"]))
    except ConfigError as e:
        log(f"learning: {e}")
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for algo, p in plans.items():
        log(f"[bench] {algo}: {p['batch_prompts']} prompts × n={p['n']} = {p['samples_per_step']} samples/step → "
            f"{p['steps']} steps = {p['steps'] * p['samples_per_step']} samples"
            + (f" ({p['demo_rows_per_group']:g} demonstration row(s) per group)" if "demo_rows_per_group" in p else ""))
    records = []
    for i, algo in enumerate(args.algos, 1):
        p, name = plans[algo], algo
        log(f"[bench] run {i}/{len(args.algos)}: {algo}, {p['steps']} steps (log {args.out_dir / (name + '.log')})")
        rec = {"bench": "learning", "algo": algo, "seed": args.seed, **p}
        res = run_and_analyse(rec, name, algo, overrides(args, p["steps"]), args,
                              lambda rows, steps=p["steps"]: analyse(rows, steps))
        if res.ok:
            log(f"[bench] {algo}: accuracy {fmt(rec['accuracy_before'])} → {fmt(rec['accuracy_end'])} "
                f"(best {fmt(rec['accuracy_best'])}), {fmt(rec['samples_per_s'], '.1f')} samples/s, "
                f"{res.seconds or 0:.0f} s end to end")
        records.append(rec)
        print(json.dumps(rounded(rec)), flush=True)
    report = render(args, records)
    args.table.parent.mkdir(parents=True, exist_ok=True)
    args.table.write_text(report)
    if any(r["status"] == "ok" for r in records):
        plot(records, args.plot, f"{args.samples} samples per algorithm, seed {args.seed}")
        log(f"[bench] curves written to {args.plot}")
    log("\n" + report + f"\n[bench] table written to {args.table}")
    return 0 if all(r["status"] == "ok" for r in records) else 1


def overrides(args: argparse.Namespace, steps: int) -> list[str]:
    return [f"seed={args.seed}", f"learner.steps={steps}", f"learner.eval_every={args.eval_every}", *args.extra]


if __name__ == "__main__":
    sys.exit(main())
