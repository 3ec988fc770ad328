"""How much asynchrony buys: sweep `buffer.max_staleness` K over real `algo-train` runs.

For each seed and each K (default K ∈ {0, 1, 2, 4}; `auto` = `buffer.max_staleness: auto`, the run
chooses K itself: launch/loop/staleness_auto.py) one real run: 2 vLLM actors, the buffer process,
the learner and weight sync, the same seed, the same number of optimiser steps and the same evaluation
schedule. Every step consumes exactly `learner.batch_prompts × rollout.n` samples whatever K is, so
the same step means the same sample budget. K = 0 is the synchronous baseline: actors start work only
at the learner's current version and only one batch's worth, so generation and training alternate.

Placement (launch/planning/placement.py, applied by launch/loop/graph.py on a CPU machine without --ray-address): the
learner rank takes whole cores from the top (on a 2-core box core 1: `sched_setaffinity` + one torch
thread); the actor engines are not pinned, so they use what the learner leaves idle. (Results recorded before 2026-11-26 had the two 0.5-CPU engines
sharing core 0.) The driver, the buffer process and Ray are not pinned. The script prints the plan for
the resolved configuration before running.

Reported per run (one JSON line each on stdout) and per K (a markdown table, and one summary JSON line):
- samples/s in steady state: samples the learner consumed ÷ wall-clock, over the steps after the
  first `--skip-steps` (cold start: empty pipeline, first weight push, allocator warm-up), leaving out
  the K + 1 steps after each in-loop evaluation (the first holds the evaluation; the actors generate
  ahead meanwhile, up to K + 1 batches — bench.common.runs.steady_state says why they are left out rather than
  the evaluation time subtracted). Intervals come from `time/wall_s` (docs/metrics.md).
- ratio to K = 0 of the same seed.
- the ideal overlap bound (T_gen + T_train) / max(T_gen, T_train), from the K = 0 run's own per-step
  means over the same steady-state steps:
    T_gen   = time/generate_wait_s. With K = 0 the buffer grants credit only once the driver announces
              the new version (after the weight push), so the driver's wait in pull_batch is the whole
              generation of one batch, minus the few milliseconds of bookkeeping between
              set_version and the next pull (metrics, buffer stats, actor health checks).
    T_train = time/train_s + time/weight_sync_s: the driver's critical path during which no batch is
              consumed; with K ≥ 1 actors keep generating through the learner step and, apart from
              the moment the engines load the new weights, through the push. The bookkeeping left
              over ("other" = measured interval − wait − train − sync) is in neither: it cannot
              overlap, so it is a cost the bound ignores.
  The more pessimistic bound that counts the push as stalling both sides, (T_gen + T_tr + T_sync) /
  (max(T_gen, T_tr) + T_sync), is in the JSON as `ideal_bound_sync_serial`.
- share of the bound reached: ratio ÷ bound (goal at `--goal-k`, default 2: ≥ 0.8).
- mean `is/ess`, `mismatch/kl`, `staleness/mean` (and max), `buffer/dropped_stale` (final, cumulative)
  over the steady-state steps.
- held-out greedy accuracy at equal samples: `eval/accuracy` at the last step (every run evaluates at
  the same steps; by default only before RL and at the last step, so no evaluation disturbs the timed
  window). Against K = 0 it is compared per seed (same seed = same warmed-up starting model and prompt
  order): Δ = mean over seeds of acc_K − acc_0, judged against σ = max(standard error of the paired
  differences across seeds, binomial standard error of the evaluation itself); "no worse than
  synchronous beyond seed noise" means Δ ≥ −2σ. With one seed only the evaluation's own noise is known.

Profiles (`--profile`):
- `quickstart` (default; also named `generation-heavy`): the algorithm's configs/<algo>.yaml as is. There the learner step (~0.4 s +
  ~0.2 s push) is short next to generating a batch (~3 s), so the bound is only ~1.1–1.2 and the
  overlap is barely tested.
- `learner-heavy`: a larger built-in model, so the learner's share of a step grows:
  model.tiny.hidden_size=256, model.tiny.num_heads=4 (head_dim stays 64, as vLLM's CPU attention
  needs), model.tiny.num_layers=4, model.tiny.intermediate_size=768 — 3.4M parameters instead of 0.44M —
  and model.sft_warmup_steps=150 instead of 300, because each SFT step of the larger model costs ~5×
  more (the warmed model is built once per seed and cached in model.cache_dir). Nothing else changes:
  same task, batch, group size, response budget, learning rate and algorithm. It is a model size, not an
  artificial delay. Why it balances the two sides: the learner's cost grows with the parameter count —
  bench/perf/learner_bench.py, 64 samples of 20-token prompts + 20–60-token responses, 1 thread, one
  process, same load: 0.33 s a step for the 0.44M model, 1.82 s for this one — while generating with a
  tiny model on CPU is dominated by per-step engine overhead and grows much less. Not yet verified end
  to end (no run of this profile was made while the machine was shared): the K=0 row reports the
  T_gen / T_train it actually got, and `acc before` whether the shorter warm-up left a usable start.

Reading the share of the bound: K ≥ 1 also admits up to K + 1 batches of prompts at once where K = 0
admits one, so the engines batch more sequences per decode step and generate a batch faster than the
K = 0 run's T_gen; the share can therefore exceed 1 without anything being wrong.

Run (2-core machine, otherwise idle; each run also pays ~2 min of Ray + vLLM start-up):
  # throughput: one seed, K ∈ {0,1,2,4}, ≈20–25 min (+ ~3 min once per seed to warm the larger model up)
  .venv/bin/python bench/e2e/staleness.py --profile learner-heavy --steps 60
  # accuracy at equal samples against seed noise, quick-start model, ≈25 min
  .venv/bin/python bench/e2e/staleness.py --ks 0 2 --seeds 0 1 2 --steps 60
  # auto against the fixed bounds, on both profiles
  .venv/bin/python bench/e2e/staleness.py --profile generation-heavy --ks 0 1 2 4 auto --steps 40
  .venv/bin/python bench/e2e/staleness.py --profile learner-heavy --ks 0 1 2 4 auto --steps 40
An `auto` run reports the bound it ended with (`buffer/max_staleness` of its last row); its steady-state
window includes the steps it measured at its starting K, so their cost is in its samples/s.
Every run shortens the config's cosine schedule to --steps (it decays to 0 at learner.steps), the same
for every K.
Re-analyse finished runs without training again: add `--reuse --out-dir DIR`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import (  # noqa: E402
    accuracy_at,
    add_run_options,
    finish_run_options,
    fmt,
    ideal_bound,
    ideal_bound_sync_serial,
    log,
    machine,
    markdown_table,
    max_over,
    mean_over,
    ratio,
    rounded,
    run_and_analyse,
    steady_state,
    training_rows,
)
from bench.common.stats import mean_sd, paired_accuracy_delta  # noqa: E402

PROFILES: dict[str, list[str]] = {
    "quickstart": [],
    "generation-heavy": [],  # the quick-start: generating a batch takes ~2× the learner step
    "learner-heavy": ["model.tiny.hidden_size=256", "model.tiny.num_heads=4", "model.tiny.num_layers=4",
                      "model.tiny.intermediate_size=768", "model.sft_warmup_steps=150"],
}
RESERVED = {"seed": "--seeds", "buffer.max_staleness": "--ks", "learner.steps": "--steps",
            "learner.eval_every": "--eval-every"}
GOAL_SHARE = 0.8
AUTO = "auto"


def k_arg(text: str) -> int | str:
    """--ks: a bound K ≥ 0, or auto."""
    if text == AUTO or text.isdigit():
        return text if text == AUTO else int(text)
    raise argparse.ArgumentTypeError(f"expected K ≥ 0 or {AUTO}, got {text!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Sweep buffer.max_staleness K over real algo-train runs: steady-state samples/s, ratio "
                    "to K=0, the ideal overlap bound, ESS, mismatch KL, staleness and accuracy at equal "
                    "samples. One JSON line per run on stdout; a markdown table in --table.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ks", type=k_arg, nargs="+", default=[0, 1, 2, 4], metavar="K",
                   help="max_staleness values (0 = synchronous baseline; needed for ratios and the bound; auto = "
                        "the run chooses)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="S",
                   help="seeds (top-level `seed`: starting model, prompt order, sampling); every K runs each")
    p.add_argument("--steps", type=int, default=60, help="optimiser steps of every run (= equal samples)")
    p.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="learner.eval_every; default = --steps (evaluate only before RL and at the end)")
    p.add_argument("--skip-steps", type=int, default=3, metavar="N",
                   help="first steps left out of the steady-state samples/s")
    p.add_argument("--profile", choices=sorted(PROFILES), default="quickstart",
                   help="configuration on top of configs/<algo>.yaml (see the module docstring)")
    p.add_argument("--algo", default="grpo", help="algorithm (configs/<algo>.yaml)")
    p.add_argument("--goal-k", type=int, default=2, help="K whose result is judged against the goals")
    add_run_options(p, "staleness")
    args = p.parse_args(argv)
    if args.steps <= args.skip_steps:
        p.error(f"--steps {args.steps} leaves nothing after --skip-steps {args.skip_steps}")
    args.eval_every = args.steps if not args.eval_every else args.eval_every
    args.ks = sorted(k for k in set(args.ks) if k != AUTO) + [AUTO] * (AUTO in args.ks)
    return finish_run_options(p, args, "staleness", RESERVED)


def overrides_for(args: argparse.Namespace, k: int, seed: int) -> list[str]:
    return [*PROFILES[args.profile], f"seed={seed}", f"buffer.max_staleness={k}", f"learner.steps={args.steps}",
            f"learner.eval_every={args.eval_every}", *args.extra]


def analyse(rows: list[dict], steps: int, skip: int, k: int | str = 0) -> dict:
    """Everything one run (max_staleness `k`, or auto) contributes, from its metrics rows alone."""
    train = training_rows(rows)
    if len(train) != steps:
        raise ValueError(f"metrics.jsonl holds {len(train)} training rows, expected {steps}")
    k_end = train[-1].get("buffer/max_staleness")
    st = steady_state(rows, skip, settle=((k_end or 0) if k == AUTO else k) + 1)
    if not st.steps:
        raise ValueError("no steady-state step left to measure (raise --steps or lower --skip-steps)")
    t_gen = mean_over(rows, "time/generate_wait_s", st.steps)
    t_train = mean_over(rows, "time/train_s", st.steps)
    t_sync = mean_over(rows, "time/weight_sync_s", st.steps) or 0.0
    acc_end, n_end = accuracy_at(rows, steps)
    acc_before, n_before = accuracy_at(rows, 0)
    return {
        "samples": sum(r["batch/rows"] for r in train), "samples_per_step": train[-1]["batch/rows"],
        "k_end": k_end, "samples_per_s": st.samples_per_s, "window_steps": len(st.steps), "window_left_out": st.left_out,
        "window_seconds": st.seconds,
        "t_gen_s": t_gen, "t_train_s": t_train, "t_sync_s": t_sync,
        "t_other_s": st.seconds / len(st.steps) - (t_gen + t_train + t_sync),
        "ess_mean": mean_over(rows, "is/ess", st.steps), "ess_min": min(
            (r["is/ess"] for r in train if r["step"] in st.steps and r.get("is/ess") is not None), default=None),
        "mismatch_kl_mean": mean_over(rows, "mismatch/kl", st.steps),
        "staleness_mean": mean_over(rows, "staleness/mean", st.steps),
        "staleness_max": max_over(rows, "staleness/max", st.steps),
        "dropped_stale": train[-1].get("buffer/dropped_stale"),
        "reward_mean": mean_over(rows, "reward/mean"),
        "accuracy_before": acc_before, "eval_n_before": n_before,
        "accuracy_end": acc_end, "eval_n": n_end, "eval_step": steps,
    }


def add_baseline(rec: dict, base: dict | None) -> None:
    """Ratio to the same seed's K = 0 run, and the bound from that run's own timings."""
    if base is None or base.get("status") != "ok":
        return
    t_gen, t_tr, t_sync = base["t_gen_s"], base["t_train_s"], base["t_sync_s"]
    rec["ratio_vs_k0"] = ratio(rec["samples_per_s"], base["samples_per_s"])
    rec["ideal_bound"] = ideal_bound(t_gen, t_tr + t_sync)
    rec["ideal_bound_sync_serial"] = ideal_bound_sync_serial(t_gen, t_tr, t_sync)
    rec["share_of_bound"] = ratio(rec["ratio_vs_k0"], rec["ideal_bound"])


def summarise(args: argparse.Namespace, records: list[dict]) -> tuple[list[dict], str]:
    """Per-K summaries (JSON) and the markdown report."""
    base_by_seed = {r["seed"]: r for r in records if r["k"] == 0 and r["status"] == "ok"}
    summaries, table = [], []
    for k in args.ks:
        ok = [r for r in records if r["k"] == k and r["status"] == "ok"]
        failed = [r for r in records if r["k"] == k and r["status"] != "ok"]
        s = {"summary": True, "k": k, "runs_ok": len(ok), "runs_failed": len(failed),
             "k_end": sorted({r.get("k_end") for r in ok}, key=str)}
        for key in ("samples_per_s", "ratio_vs_k0", "ideal_bound", "ideal_bound_sync_serial", "share_of_bound",
                    "ess_mean", "mismatch_kl_mean", "staleness_mean", "t_gen_s", "t_train_s", "t_sync_s",
                    "accuracy_before"):
            s[key] = mean_sd([r.get(key) for r in ok])[0]
        s["staleness_max"] = max((r["staleness_max"] for r in ok if r.get("staleness_max") is not None),
                                 default=None)
        s["dropped_stale"] = max((r["dropped_stale"] for r in ok if r.get("dropped_stale") is not None),
                                 default=None)
        s["accuracy_end"], s["accuracy_end_sd"] = mean_sd([r.get("accuracy_end") for r in ok])
        pairs = [(r["accuracy_end"], base_by_seed[r["seed"]]["accuracy_end"], r["eval_n"],
                  base_by_seed[r["seed"]]["eval_n"]) for r in ok
                 if r["seed"] in base_by_seed and r.get("accuracy_end") is not None
                 and base_by_seed[r["seed"]].get("accuracy_end") is not None and r["eval_n"]]
        s["accuracy_delta"] = paired_accuracy_delta(pairs) if pairs and k != 0 else None
        summaries.append(s)
        d = s["accuracy_delta"]
        acc = fmt(s["accuracy_end"]) + (f" ± {s['accuracy_end_sd']:.3f}" if s["accuracy_end_sd"] is not None else "")
        delta = (f"{d['delta']:+.3f} ± {d['sigma']:.3f} ({'no worse' if d['no_worse'] else 'worse'})"
                 if d else "–")
        table.append([f"auto → {'/'.join(map(str, s['k_end']))}" if k == AUTO else str(k), f"{len(ok)}" + (f" ({len(failed)} failed)" if failed else ""),
                      fmt(s["samples_per_s"], ".1f"), fmt(s["ratio_vs_k0"], ".2f"), fmt(s["ideal_bound"], ".2f"),
                      fmt(s["share_of_bound"], ".2f"), fmt(s["ess_mean"], ".4f"), fmt(s["mismatch_kl_mean"], ".4f"),
                      f"{fmt(s['staleness_mean'], '.2f')} / {fmt(s['staleness_max'], '.0f')}",
                      fmt(s["dropped_stale"], ".0f"), fmt(s["accuracy_before"]), acc, delta])
    headers = ["K", "runs", "samples/s", "ratio vs K=0", "ideal bound", "share of bound", "ESS",
               "mismatch KL", "staleness mean / max", "dropped stale", "acc before",
               f"acc @ step {args.steps} (mean ± sd)", "Δ acc vs K=0 (± σ)"]
    return summaries, render(args, records, summaries, markdown_table(headers, table))


def render(args: argparse.Namespace, records: list[dict], summaries: list[dict], table: str) -> str:
    from configs.loading import resolve

    cfg = resolve(args.algo, overrides=overrides_for(args, args.ks[0], args.seeds[0]))
    per_step = cfg.learner.batch_prompts * cfg.rollout.n
    m = machine()
    loads = [r.get("load_before") for r in records if r.get("load_before") is not None]
    lines = [
        f"### max_staleness sweep — `{args.algo}`, profile `{args.profile}`",
        "",
        f"Command: `.venv/bin/python bench/e2e/staleness.py {shlex.join(sys.argv[1:])}`",
        "",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} cores, Python {m['python']}; 1-minute load average "
        f"before the runs {min(loads, default=0):.1f}–{max(loads, default=0):.1f}. Seeds {args.seeds}; "
        f"{args.steps} steps × {per_step} samples ({cfg.learner.batch_prompts} prompts × n={cfg.rollout.n}); "
        f"steady state = steps {args.skip_steps + 1}–{args.steps} minus the K+1 steps after each in-loop "
        f"evaluation; "
        f"evaluation every {args.eval_every} steps on {cfg.data.eval_prompts} held-out prompts (greedy). "
        f"Profile overrides: {', '.join(PROFILES[args.profile]) or 'none'}; extra: {', '.join(args.extra) or 'none'}.",
        "",
        table,
        "",
    ]
    base = next((s for s in summaries if s["k"] == 0 and s["runs_ok"]), None)
    if base:
        lines.append(
            f"Bound from the K=0 runs: T_gen = {fmt(base['t_gen_s'], '.2f')} s, T_train = "
            f"{fmt(base['t_train_s'], '.2f')} s + T_sync = {fmt(base['t_sync_s'], '.2f')} s per step → "
            f"(T_gen + T_train) / max = {fmt(base['ideal_bound'], '.2f')} (push stalling both sides: "
            f"{fmt(base['ideal_bound_sync_serial'], '.2f')}).")
    else:
        lines.append("No finished K=0 run: ratios, the bound and accuracy deltas cannot be computed.")
    goal = next((s for s in summaries if s["k"] == args.goal_k), None)
    if goal and goal["runs_ok"] and base:
        share = goal["share_of_bound"]
        met = share is not None and share >= GOAL_SHARE
        lines.append(f"Goal at K={args.goal_k}: samples/s ratio {fmt(goal['ratio_vs_k0'], '.2f')} = "
                     f"{fmt(share, '.2f')} × the ideal bound (goal ≥ {GOAL_SHARE}) — **{'met' if met else 'missed'}**.")
        d = goal["accuracy_delta"]
        if d:
            noise = ("seed noise" if d["sigma_seeds"] is not None else "evaluation noise only (1 seed)")
            lines.append(f"Accuracy at equal samples (step {args.steps}): Δ = {d['delta']:+.3f} vs K=0, 2σ = "
                         f"{2 * d['sigma']:.3f} over {d['seeds']} seed(s), {noise} — "
                         f"**{'no worse' if d['no_worse'] else 'worse'} than synchronous**.")
    elif goal is None:
        lines.append(f"K={args.goal_k} was not part of this sweep (--goal-k).")
    budgets = sorted({r["samples"] for r in records if r["status"] == "ok"})
    if len(budgets) > 1:
        lines.append(f"Caution: the runs consumed different sample totals {budgets}; accuracy is not at equal "
                     "samples.")
    short = min((r["window_steps"] for r in records if r["status"] == "ok"), default=None)
    if short is not None and short < 10:
        lines.append(f"Caution: a steady-state window of only {short} step(s) — too short for the throughput "
                     "numbers to mean much (raise --steps).")
    failed = [r for r in records if r["status"] != "ok"]
    for r in failed:
        lines.append(f"Failed: K={r['k']} seed {r['seed']}: {r.get('error', '?')} (log {r['log']}).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from configs.loading import ConfigError, resolve
    from launch.planning.placement import plan_rank_cores

    try:  # every configuration validates before anything starts
        cfgs = {(k, s): resolve(args.algo, overrides=overrides_for(args, k, s)) for s in args.seeds for k in args.ks}
    except ConfigError as e:
        log(f"staleness: {e}")
        return 2
    cfg = cfgs[(args.ks[0], args.seeds[0])]
    if cfg.ray_address is None and cfg.rollout.gpus_per_actor == 0 and cfg.learner.gpus_per_rank == 0:
        ranks = plan_rank_cores(cfg.learner.world_size, cfg.learner.cpus_per_rank)
        log(f"[bench] placement: learner rank(s) on cores {ranks}, actor engines on any core")
    if 0 not in args.ks:
        log("[bench] warning: K=0 is not in --ks, so no ratio, bound or accuracy delta can be computed")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    plan = [(s, k) for s in args.seeds for k in args.ks]  # seed-major: machine drift hits every K alike
    log(f"[bench] {len(plan)} run(s) of {args.steps} steps → {args.out_dir}")
    records: list[dict] = []
    for i, (seed, k) in enumerate(plan, 1):
        name = f"k{k}-seed{seed}"
        log(f"[bench] run {i}/{len(plan)}: K={k} seed {seed} (log {args.out_dir / (name + '.log')})")
        rec = {"bench": "staleness", "algo": args.algo, "profile": args.profile, "k": k, "seed": seed,
               "steps": args.steps}
        res = run_and_analyse(rec, name, args.algo, overrides_for(args, k, seed), args,
                              lambda rows, k=k: analyse(rows, args.steps, args.skip_steps, k))
        base = next((r for r in records if r["seed"] == seed and r["k"] == 0), rec if k == 0 else None)
        if rec["status"] == "ok":
            add_baseline(rec, base)
            log(f"[bench] K={k} seed {seed}: {fmt(rec['samples_per_s'], '.1f')} samples/s, ratio vs K=0 "
                f"{fmt(rec.get('ratio_vs_k0'), '.2f')}, ESS {fmt(rec['ess_mean'], '.3f')}, accuracy "
                f"{fmt(rec['accuracy_end'])} ({res.seconds or 0:.0f} s end to end)")
        records.append(rec)
        print(json.dumps(rounded(rec)), flush=True)
    summaries, report = summarise(args, records)
    for s in summaries:
        print(json.dumps(rounded(s)), flush=True)
    args.table.parent.mkdir(parents=True, exist_ok=True)
    args.table.write_text(report)
    log("\n" + report + f"\n[bench] table written to {args.table}")
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
