"""Evidence studies: does each algorithm do what its paper says it is for, over seeds, on tasks built to show it?

Every run is a real `algo-train` (rollout.num_actors vLLM actors: 1 in every shipped config; the buffer process, the
learner; bench/common/runs.py), its own
configs/<algo>.yaml plus the study's and the arm's overrides, the seed, the study's step count and
evaluation period. A study runs every arm for every seed (seeds outermost: after seed 0 every arm has a
result) into `--out-dir/<study>/<arm>-s<seed>`; a run folder that already holds a finished run is reused,
so a study can be stopped and continued, and `--reuse` re-analyses without starting anything.

Studies (bench/evidence/evidence_studies.py holds the exact overrides):
  luffy      a weak start (model.sft_warmup_steps small: greedy held-out accuracy near 0) — GRPO against
             LUFFY with teacher rows from the task's reference solutions, equal samples.
  luffy-beyond  a model that has the format but not the task: the shipped warm model (300 SFT steps on the
             2-digit task), trained on 3-digit +/− (held-out accuracy near 0 at the start) — GRPO against
             LUFFY, equal samples. Every arm of a seed starts from the same model (`warm_start`).
  dense      the quick-start task (2-digit +/−, column steps with carries, rule step checker): RLOO (outcome
             only), PURE min-form, PURE sum-form (credit=gamma, γ=1: step scores summed), PRIME (implicit
             PRM trained online) — samples to reach the start + `threshold` accuracy.
  pacs       GRPO against PACS with each weight_mode (question = class-balanced, only_positive,
             only_negative, none), equal samples.
  staleness  learner.mini_batches 4 × epochs 2 (8 optimiser steps per learner step: the PPO clip acts and
             the learner is slower than the actors, so the buffer fills and rows reach the bound K),
             K ∈ {0, 2, 8, 16} × loss.is_correction ∈ {none, tis, decoupled}; K = 0 once (tis), where the
             three coincide up to sampler/learner numerics.
  steps-*    on the step-by-step testbed (`--testbed steps`: 4-5 digit worked solutions, a 4-layer warm model,
             a learned PRM; launch.prep.testbed); every seed starts from seed 0's warm model and PRM, so
             seeds vary the RL run (prompt order, sampling), as the papers' seeds do:
    steps-hacking  PURE min- vs sum-form credit with PRM-only reward (pure.c_vr=0) from the learned PRM;
    steps-dense    RLOO (outcome only), PURE min-form (learned PRM + verifier), PRIME; samples to RLOO's
                   final accuracy;
    steps-prm-drift  no runs: the fixed learned PRM's and PRIME's online PRM's accuracy on the policy's own
                   rollouts over the steps-dense runs (pure/prm_pair_acc, pure/prm_step_acc, prime/dpo_acc);
    steps-luffy-beyond  GRPO against LUFFY on steps-hard (7-8 digits: the warm model's pass@8 is 0);
    steps-pacs     GRPO against PACS, both at 4 optimiser steps per RL step;
    steps-prm-frozen  PRIME's implicit PRM online against the same PRM frozen after 10 steps (prime.prm_update),
                   5 seeds: the drift on the paper's pairwise metric (its `registered` test).
    steps-opd, steps-hacking-pure, steps-credit, steps-luffy-beyond5, steps-pacs5  pre-registered (issues 40
                   and 43): each Study's `registered` text states its arms' purpose, its test and verdict rule
                   (in code: bench/evidence/study_tests.py), and DIFFERS / PRECONDITION what differs from the
                   paper and what was checked before its runs (bench/evidence/level_precheck.py).
             Each names `traces`: training metrics tabulated and drawn over the run (bench/evidence/evidence_traces.py).
  cost       no runs of its own: seconds per sample and seconds to the threshold of each algorithm, from
             the dense and pacs runs (same task, same budget, same machine).

Per run: held-out greedy accuracy at every evaluation (step 0 = before RL), samples (Σ batch/rows, exact),
training seconds (the loop's clock minus evaluations, bench.common.runs.training_clock), mean ESS, mismatch KL,
staleness and clip fraction. Per arm over seeds: mean ± standard error (SE) of the final and best accuracy and of the gain
over the start; samples (and seconds) until the first evaluation at or above the run's own start +
`threshold` (a seed that never gets there counts as "not reached" and the arm's mean is over the seeds
that did, with the count shown). Against the study's baseline arm: the paired difference of final
accuracy, seed by seed (same seed = same starting model and prompt order), with σ = max(seed SE,
evaluation binomial SE), and its t = Δ/σ with seeds − 1 degrees of freedom and two-sided p-value
(bench.common.stats.paired_accuracy_delta). The table gives the numbers; the verdict words (reproduced,
direction only, not reproduced, inconclusive) need what a table cannot know, whether the test was the paper's
(bench.common.stats.verdict), and are written in bench/RESULTS.md.

Output: one JSON line per run on stdout, `bench/evidence_<study>.md` (table) and
`bench/evidence_<study>.png` (mean accuracy ± SE over seeds vs samples, one line per arm; one panel more per
trace: bench/evidence/evidence_traces.py).

  .venv/bin/python bench/evidence/evidence.py --study luffy            # 2 arms × 3 seeds
  .venv/bin/python bench/evidence/evidence.py --study all --reuse      # tables and plots from the recorded runs
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import (  # noqa: E402
    ROOT,
    cumulative_samples,
    finished,
    fmt,
    load_average,
    log,
    machine,
    markdown_table,
    mean_over,
    rounded,
    run_and_analyse,
    sample_curve,
    training_clock,
    training_rows,
)
from bench.common.stats import mean_se, paired_accuracy_delta  # noqa: E402
from bench.evidence.evidence_studies import (  # noqa: E402
    COST_FROM,
    DIFFERS,
    PRECONDITION,
    STUDIES,
    Study,
    build_teacher,
    config_file,
    run_overrides,
    testbed_start,
)
from bench.evidence.evidence_traces import draw_traces, trace_rows  # noqa: E402


def analyse(rows: list[dict], steps: int, threshold: float, traces: tuple[str, ...] = ()) -> dict:
    train, curve = training_rows(rows), sample_curve(rows, steps)
    clock, samples = training_clock(rows), cumulative_samples(rows)
    if curve[-1]["step"] != steps:
        raise ValueError("metrics.jsonl lacks the evaluation at the last step")
    before = curve[0]["accuracy"]
    reached = next((c for c in curve[1:] if c["accuracy"] >= before + threshold), None)
    keys = {"ess": "is/ess", "mismatch_kl": "mismatch/kl", "staleness": "staleness/mean", "clipfrac": "pg/clipfrac",
            "demo_row_frac": "luffy/offpolicy_row_frac", "reward": "reward/mean"}
    return {"accuracy_before": before, "accuracy_end": curve[-1]["accuracy"], "eval_n": curve[-1]["eval_n"],
            "accuracy_best": max(c["accuracy"] for c in curve[1:]),
            "samples": samples[steps], "train_s": clock[steps], "s_per_sample": clock[steps] / samples[steps],
            "samples_to_threshold": reached["samples"] if reached else None,
            "seconds_to_threshold": reached["train_s"] if reached else None,
            "collapse_step": next((c["step"] for c in curve[1:] if c["accuracy"] <= before / 2), None) if before else None,
            "staleness_max": max((r.get("staleness/max") or 0 for r in train), default=None),
            **{k: mean_over(rows, v) for k, v in keys.items()}, "curve": curve,
            "traces": {k: {r["step"]: r[k] for r in train if r.get(k) is not None} for k in traces}}


def summarise(recs: list[dict]) -> dict:
    """One arm over its seeds (finished runs only): means ± standard errors."""
    ok = [r for r in recs if r["status"] == "ok"]
    out: dict = {"seeds": len(ok), "failed": len(recs) - len(ok)}
    for key in ("accuracy_before", "accuracy_end", "accuracy_best", "s_per_sample", "ess", "mismatch_kl",
                "staleness", "clipfrac", "demo_row_frac"):
        out[key] = mean_se([r.get(key) for r in ok])
    out["gain"] = mean_se([r["accuracy_end"] - r["accuracy_before"] for r in ok])
    out["staleness_max"] = max((r["staleness_max"] for r in ok if r.get("staleness_max") is not None), default=None)
    for key in ("samples_to_threshold", "seconds_to_threshold", "collapse_step"):
        got = [r[key] for r in ok if r.get(key) is not None]
        out[key] = (*mean_se(got), len(got))
    return out


def samples_to(recs: list[dict], target: float | None) -> tuple:
    """(mean, SE, seeds) of the samples until held-out accuracy first reached `target`, over the seeds that did."""
    got = [next((c["samples"] for c in r["curve"][1:] if c["accuracy"] >= target), None)
           for r in recs if r["status"] == "ok"] if target is not None else []
    got = [g for g in got if g is not None]
    return (*mean_se(got), len(got))


def paired(study: Study, by_arm: dict[str, list[dict]], arm: str) -> dict | None:
    base = {r["seed"]: r for r in by_arm.get(study.baseline, []) if r["status"] == "ok"}
    pairs = [(r["accuracy_end"], base[r["seed"]]["accuracy_end"], r["eval_n"], base[r["seed"]]["eval_n"])
             for r in by_arm.get(arm, []) if r["status"] == "ok" and r["seed"] in base]
    return paired_accuracy_delta(pairs) if pairs and arm != study.baseline else None


def pm(ms: tuple, spec: str = ".3f") -> str:
    mean, sd = ms[0], ms[1]
    return fmt(mean, spec) + (f" ± {fmt(sd, spec)}" if sd is not None else "")


def reached(ms: tuple, total: int, spec: str) -> str:
    mean, sd, n = ms
    return "not reached" if not n else f"{pm((mean, sd), spec)} ({n}/{total})"


def render(study: Study, by_arm: dict[str, list[dict]], seeds: list[int], cmd: str) -> str:
    rows = []
    base = summarise(by_arm.get(study.baseline, []))
    # the baseline's final accuracy, when it rose above its start (else every arm "reaches" it at once)
    target = base["accuracy_end"][0] if (base["accuracy_end"][0] or 0) > (base["accuracy_before"][0] or 0) else None
    collapses = any(r.get("collapse_step") for recs in by_arm.values() for r in recs)
    for arm in study.arms:
        recs = by_arm.get(arm.name, [])
        s = summarise(recs)
        d = paired(study, by_arm, arm.name)
        verdict = "baseline" if arm.name == study.baseline else "–" if d is None else (
            f"{d['delta']:+.3f} ± {d['sigma']:.3f}" + (f" (t = {d['t']:.2f}, df = {d['df']}, p = {d['p']:.2f})"
                                                        if d["p"] is not None else
                                                        " (one seed: no test)" if d["seeds"] < 2 else
                                                        " (no noise: every pair equal; no t test: study_tests.py:none_right_word gives the word)"))
        extra = [pm(s["staleness"], ".2f") + f" / {fmt(s['staleness_max'], '.0f')}", pm(s["ess"], ".4f"),
                 pm(s["mismatch_kl"], ".4f"), pm(s["clipfrac"], ".3f")] if study.name == "staleness" else []
        rows.append([arm.name, f"{s['seeds']}/{len(seeds)}", pm(s["accuracy_before"]), pm(s["accuracy_end"]),
                     pm(s["accuracy_best"]), pm(s["gain"]), verdict,
                     reached(s["samples_to_threshold"], s["seeds"], ".0f"),
                     reached(samples_to(recs, target), s["seeds"], ".0f"), pm(s["s_per_sample"], ".4f"), *extra,
                     *([reached(s["collapse_step"], s["seeds"], ".0f")] if collapses else [])])
    heads = ["arm", "seeds", "acc before", "acc end", "best", "gain", f"Δ end vs {study.baseline} (paired)",
             f"samples to start+{study.threshold:g}", f"samples to {study.baseline}'s end ({fmt(target)})",
             "train s / sample"]
    if study.name == "staleness":
        heads += ["staleness mean / max", "ESS", "mismatch KL", "clipfrac"]
    if collapses:
        heads.append("collapse: first step with acc ≤ ½ start")
    m = machine()
    loads = [x for recs in by_arm.values() for r in recs for x in (r.get("load_before"), r.get("load_after"))
             if x is not None]
    return "\n".join([
        f"### {study.title} (`bench/evidence/evidence.py --study {study.name}`)", "",
        f"Paper: {study.claim}.", "",
        *([study.registered, ""] if study.registered else []),
        *([f"Differs from the paper: {DIFFERS[study.name]}.", ""] if study.name in DIFFERS else []),
        *([f"Precondition (checked before the runs): {PRECONDITION[study.name]}.", ""]
          if study.name in PRECONDITION else []),
        (f"Tables from `{cmd}`, which starts no run (the command that made the runs is in bench/RESULTS.md)."
         if "--reuse" in cmd.split() else f"Command: `{cmd}`.")
        + f" {study.steps} learner steps × 64 samples per arm and seed, seeds {seeds}, evaluation "
        f"(greedy, 200 held-out prompts) every {study.eval_every} steps. Overrides on every arm: "
        f"{', '.join(study.common) or 'none'}; per arm: "
        + "; ".join(f"{a.name} = `--algo {a.algo}`" + (f" {' '.join(a.overrides)}" if a.overrides else "")
                    for a in study.arms) + ".",
        f"Machine: {m.get('cpu', '?')}, {m['cpus']} cores; "
        + (f"1-minute load {min(loads):.1f}–{max(loads):.1f} during the runs started by this command" if loads
           else "the load during the runs is in the log of the command that ran them (not re-read by --reuse)")
        + " (seconds per sample are only comparable at similar load).", "",
        *([f"The runs are `--study {study.source}`'s; its table gives their held-out accuracy.", ""] if study.source
          else ["Means ± standard errors over seeds.", "", markdown_table(heads, rows), ""]),
        *trace_table(study, by_arm), f"Plot: `bench/evidence_{study.name}.png`.", ""])


def trace_table(study: Study, by_arm: dict[str, list[dict]]) -> list[str]:
    rows = trace_rows([a.name for a in study.arms], by_arm, study.traces, study.steps, study.eval_every)
    if not rows:
        return []
    return [f"Training metrics over the run (window means of {study.eval_every} steps, mean ± SE over seeds; "
            "change = last − first, paired by seed):", "",
            markdown_table(["arm", "metric", "seeds", "first window", "last window", "change"], rows), ""]


def plot(study: Study, by_arm: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in study.traces if any(r.get("traces", {}).get(k) for recs in by_arm.values() for r in recs)]
    cols = min(3, 1 + len(keys))
    rows = math.ceil((1 + len(keys)) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 if cols == 1 else 4.6 * cols, 4.2 * rows), squeeze=False)
    flat = list(axes.flat)
    for extra in flat[1 + len(keys):]:
        extra.set_visible(False)
    draw_traces(flat[1:1 + len(keys)], [a.name for a in study.arms], by_arm, keys, study.steps, study.eval_every)
    ax = flat[0]
    for arm in study.arms:
        ok = [r for r in by_arm.get(arm.name, []) if r["status"] == "ok"]
        if not ok:
            continue
        steps = sorted(set.intersection(*({c["step"] for c in r["curve"]} for r in ok)))
        xs = [statistics.fmean(c["samples"] for r in ok for c in r["curve"] if c["step"] == s) for s in steps]
        per = [[c["accuracy"] for r in ok for c in r["curve"] if c["step"] == s] for s in steps]
        mean = [statistics.fmean(v) for v in per]
        sd = [statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0 for v in per]
        ax.plot(xs, mean, marker="o", ms=3, label=f"{arm.name} ({len(ok)} seeds)")
        ax.fill_between(xs, [a - b for a, b in zip(mean, sd)], [a + b for a, b in zip(mean, sd)], alpha=0.15)
    ax.set_xlabel("samples consumed by the learner")
    ax.set_ylabel("held-out accuracy (greedy), mean ± SE over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    (fig.suptitle if keys else ax.set_title)(study.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_cost(records: dict[str, dict[str, list[dict]]]) -> str:
    """Seconds per sample and to the threshold, per algorithm at its shipped config (dense + pacs runs)."""
    rows = []
    for name in COST_FROM:
        study = STUDIES[name]
        for arm in study.arms:
            s = summarise(records.get(name, {}).get(arm.name, []))
            if not s["seeds"]:
                continue
            rows.append([f"{arm.name} ({name})", str(s["seeds"]), pm(s["s_per_sample"], ".4f"),
                         reached(s["samples_to_threshold"], s["seeds"], ".0f"),
                         reached(s["seconds_to_threshold"], s["seeds"], ".0f")])
    return "\n".join([
        "### What each algorithm costs (`bench/evidence/evidence.py --study cost`: the dense and pacs runs)", "",
        "Training seconds (the loop's clock, evaluations excluded) per sample the learner consumed, and samples / "
        "seconds until held-out accuracy first reached the run's start + 0.10, mean ± SE over the seeds that got "
        "there (count in brackets). Same task, budget and machine; the runs ran one after another, so the "
        "machine's load drifts between them (each study's table gives the range).", "",
        markdown_table(["algorithm (study)", "seeds", "train s / sample", "samples to start+0.1",
                        "seconds to start+0.1"], rows), ""])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", nargs="+", required=True, choices=[*STUDIES, "cost", "all"])
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="default: each study's registered seeds, 0 ... Study.seeds - 1")
    p.add_argument("--arms", nargs="+", default=None, help="only these arms (default: every arm of the study)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "runs" / "evidence",
                   help="folder of the studies' run folders, reused across invocations "
                        "(default: the repository's runs/evidence)")
    p.add_argument("--timeout-s", type=float, default=1800.0,
                   help="per-run limit in seconds, stopped cleanly after it (default: %(default)s)")
    p.add_argument("--reuse", action="store_true", help="start no run: analyse the finished runs only")
    p.add_argument("--echo", choices=["progress", "all", "none"], default="none",
                   help="print each run's progress and error lines, all its output, or none (default: %(default)s)")
    args = p.parse_args(argv)
    if "all" in args.study:
        args.study = [*STUDIES, "cost"]
    return args


def seeds_of(study: Study, args) -> list[int]:
    """The seeds to run or read: --seeds, else the study's registered ones."""
    return args.seeds if args.seeds is not None else list(range(study.seeds))


def collect(study: Study, args, run_missing: bool) -> dict[str, list[dict]]:
    """Every arm's record per seed; a study with a `source` reads that study's runs and starts none."""
    runs_of = STUDIES[study.source] if study.source else study
    by_arm: dict[str, list[dict]] = {}
    for seed in seeds_of(study, args):
        for arm in study.arms:
            if args.arms and arm.name not in args.arms:
                continue
            name = f"{arm.name}-s{seed}"
            rec = {"bench": "evidence", "study": study.name, "arm": arm.name, "seed": seed}
            opts = argparse.Namespace(out_dir=args.out_dir / runs_of.name, timeout_s=args.timeout_s, echo=args.echo,
                                      reuse=args.reuse or not run_missing or study.source is not None)
            opts.reuse = opts.reuse or finished(opts.out_dir / name)
            if not opts.reuse:
                log(f"[evidence] {study.name}/{name} (load {load_average()})")
            run_and_analyse(rec, name, arm.algo, run_overrides(study, arm, seed), opts,
                            lambda rows: analyse(rows, study.steps, study.threshold, study.traces),
                            config=config_file(study))
            if rec["status"] == "ok" and not opts.reuse:
                log(f"[evidence] {name}: {fmt(rec['accuracy_before'])} -> {fmt(rec['accuracy_end'])}, "
                    f"{rec['run_s']:.0f} s")
            print(json.dumps(rounded({k: v for k, v in rec.items() if k not in ("curve", "traces")})), flush=True)
            by_arm.setdefault(arm.name, []).append(rec)
    return by_arm


def main(argv=None) -> int:
    args = parse_args(argv)
    from configs.loading import ConfigError, resolve

    try:  # every configuration validates before anything starts
        for name in args.study:
            for arm in STUDIES[name].arms if name in STUDIES else ():
                study = STUDIES[name]
                resolve(arm.algo, config_file(study), {}, run_overrides(study, arm, 0))
                testbed_start(study, arm, build=not args.reuse and study.source is None)
            if name in STUDIES and not args.reuse:
                build_teacher(STUDIES[name])
    except ConfigError as e:
        log(f"evidence: {e}")
        return 2
    cmd = ".venv/bin/python bench/evidence/evidence.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    records: dict[str, dict[str, list[dict]]] = {}
    for name in (n for n in args.study if n in STUDIES):
        study = STUDIES[name]
        records[name] = collect(study, args, run_missing=True)
        (ROOT / "bench" / f"evidence_{name}.md").write_text(render(study, records[name], seeds_of(study, args), cmd))
        plot(study, records[name], ROOT / "bench" / f"evidence_{name}.png")
        log((ROOT / "bench" / f"evidence_{name}.md").read_text())
    if "cost" in args.study:
        for name in COST_FROM:
            if name not in records:
                records[name] = collect(STUDIES[name], args, run_missing=False)
        (ROOT / "bench" / "evidence_cost.md").write_text(render_cost(records))
        log((ROOT / "bench" / "evidence_cost.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
