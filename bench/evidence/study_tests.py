"""The registered tests of the studies whose verdict is not a column of the study's table (each study's `registered`
text in bench/evidence/evidence_studies.py states its test before the runs it judges). Each reads the finished runs
in OUT_DIR/<study>/<arm>-s<seed>/ and prints its per-seed figures, its statistic and its verdict word:

    steps-prm-frozen    per seed, the change of prime/dpo_acc from steps 1-10 to the last 10, online − frozen;
                        paired t over the seeds, paper's sign +1, matters 0.05
    steps-hacking-pure  T1: final held-out accuracy sum-prm − min-prm (paper's sign −1); T2: sum-mix − sum-prm
                        (+1); both paired over the seeds (`paired_accuracy_delta`), matters 0.10; beside them the
                        collapses per arm and a per-prompt paired bootstrap of the final models pooled over seeds
    steps-opd           per seed, S = the samples OPD needs to reach that seed's GRPO final held-out accuracy;
                        reproduced if S ≤ 2,560 on every seed, direction only if S < 5,120 on every seed, not
                        reproduced if OPD reaches it on no seed, inconclusive otherwise; beside it the training
                        seconds to that point and both arms' accuracy at equal training seconds (load-dependent
                        on a shared machine: the load of each run is in the study's log)
    steps-credit        per dense arm and seed, S = the generated samples the arm needs until its training accuracy
                        on all generated rollouts (20-step window) reaches RLOO's over steps 181-200, against N,
                        RLOO's generated samples; the rule of steps-opd on (S, N) with N per seed; beside it the
                        paired final held-out accuracy
    steps-luffy-beyond5 final held-out accuracy LUFFY − GRPO, paired, paper's sign +1, matters 0.05; beside it the
                        on-policy train accuracy and accuracy/train_groups_solved of steps 201-250, and (--sample)
                        each final model's held-out pass@8
    steps-pacs5         final held-out accuracy PACS − GRPO, paired, +1, matters 0.05, inconclusive unless GRPO's
                        entropy fell (last 25 steps below the first 25) on at least 4 of 5 seeds; beside it
                        (--sample) the final models' pass@k, k = 1 ... 64

While any arm lacks one of the seeds its registration names (`Study.seeds`), the output ends with an INTERIM line
naming the missing runs: the words above it then apply the rule to the seeds finished so far, no verdict yet.

`--sample` also samples each finished run's final model on held-out prompts (one vLLM engine, a few minutes per
run; cached as final_sampled_<prompts>x<samples>.json in the run's folder).

    .venv/bin/python bench/evidence/study_tests.py --study steps-hacking-pure --out-dir runs/evidence
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import finished, load_rows, sample_curve, training_rows  # noqa: E402
from bench.common.stats import (  # noqa: E402
    final_prompt_rewards,
    mean_se,
    none_right_upper,
    paired_accuracy_delta,
    paired_bootstrap,
    verdict,
)
from bench.evidence.evidence_studies import STUDIES  # noqa: E402


def runs(out_dir: Path, study: str, arm: str) -> dict[int, Path]:
    """seed -> run folder of the finished runs of `arm`."""
    found = {}
    for d in sorted((out_dir / study).glob(f"{arm}-s*")):
        seed = d.name.rsplit("-s", 1)[1]
        if d.is_dir() and seed.isdigit() and finished(d):
            found[int(seed)] = d
    return found


def paired_runs(out_dir: Path, study, arm: str, base: str) -> list[tuple[int, Path, Path]]:
    """(seed, run of `arm`, run of `base`) for every seed both arms finished, in seed order."""
    a, b = runs(out_dir, study.name, arm), runs(out_dir, study.name, base)
    return [(s, a[s], b[s]) for s in sorted(set(a) & set(b))]


def interim(out_dir: Path, study) -> str | None:
    """None when every arm finished all the seeds the study registered (`Study.seeds`); else the line saying the
    words the test prints apply its rule to the seeds finished so far and are no verdict yet."""
    missing = {a.name: left for a in study.arms
               if (left := [s for s in range(study.seeds) if s not in runs(out_dir, study.name, a.name)])}
    if not missing:
        return None
    return (f"INTERIM, no verdict: the registration names seeds 0-{study.seeds - 1} and these have not finished: "
            + "; ".join(f"{arm} {seeds}" for arm, seeds in missing.items())
            + ". Every word above applies the registered rule to the seeds finished so far.")


def curve(run: Path, steps: int) -> list[dict]:
    """The run's held-out evaluations: [{step, samples, accuracy, eval_n}], step 0 first."""
    return sample_curve(load_rows(run), steps)


def say_verdict(name: str, effect: float, se: float, df: int, sign: int, matters: float) -> None:
    print(f"{name}: {effect:+.3f} ± {se:.3f} -> {verdict(effect, se, df, sign, matters=matters).text()}")


def paired_final(out_dir: Path, study, arm: str, base: str, seeds=None) -> dict | None:
    pairs = []
    for s, ra, rb in paired_runs(out_dir, study, arm, base):
        if seeds is not None and s not in seeds:
            continue
        ca, cb = curve(ra, study.steps)[-1], curve(rb, study.steps)[-1]
        pairs.append((ca["accuracy"], cb["accuracy"], ca["eval_n"], cb["eval_n"]))
        print(f"  seed {s}: {arm} {ca['accuracy']:.3f}, {base} {cb['accuracy']:.3f}, Δ {ca['accuracy'] - cb['accuracy']:+.3f}")
    return paired_accuracy_delta(pairs) | {"pairs": pairs} if len(pairs) >= 2 else None


def per_prompt_line(out_dir: Path, study, arm: str, base: str) -> None:
    """Beside a registered test, not one: arm − base on each held-out prompt (its final greedy reward, averaged
    over the paired seeds), by a paired bootstrap over the prompts. Pairing the prompts removes the
    binomial noise `paired_accuracy_delta` counts in full; the prompts, not the seeds, are the sample."""
    both = paired_runs(out_dir, study, arm, base)
    if both:
        per_prompt = [(final_prompt_rewards(ra), final_prompt_rewards(rb)) for _, ra, rb in both]
        keys = sorted(set.intersection(*(set(x) & set(y) for x, y in per_prompt)))
        xs = [statistics.fmean(x[k] for x, _ in per_prompt) for k in keys]
        ys = [statistics.fmean(y[k] for _, y in per_prompt) for k in keys]
        boot = paired_bootstrap(xs, ys)
        print(f"  per-prompt paired bootstrap pooled over {len(both)} seeds ({len(keys)} prompts; beside the "
              f"registered test): Δ {boot['delta']:+.3f} ± {boot['se']:.3f}, 95 % interval "
              f"[{boot['ci95'][0]:+.3f}, {boot['ci95'][1]:+.3f}], p = {boot['p']:.3g}")


def hacking_pure(out_dir: Path, study) -> None:
    for name, arm, base, sign in (("T1 sum-prm − min-prm", "sum-prm", "min-prm", -1),
                                  ("T2 sum-mix − sum-prm", "sum-mix", "sum-prm", +1)):
        print(name)
        d = paired_final(out_dir, study, arm, base)
        if d is None:
            print("  fewer than 2 paired seeds: no test")
            continue
        say_verdict(f"  {name} over {d['seeds']} seeds", d["delta"], d["sigma"], d["df"], sign, 0.10)
        not_seen = dict(study.unseen)
        unseen = paired_final(out_dir, study, arm, base, seeds=set(not_seen[arm]) & set(not_seen[base]))
        if unseen is not None:
            print(f"  on the seeds not seen when the test was registered: Δ {unseen['delta']:+.3f} ± {unseen['sigma']:.3f}")
        per_prompt_line(out_dir, study, arm, base)
    print("collapses (first evaluation at ≤ ½ the start) and the change of pure/process_return, per arm:")
    for arm in (a.name for a in study.arms):
        col, ret = [], []
        for _, run in sorted(runs(out_dir, study.name, arm).items()):
            c = curve(run, study.steps)
            col.append(next((x["step"] for x in c[1:] if x["accuracy"] <= c[0]["accuracy"] / 2), None))
            pr = [r["pure/process_return"] for r in training_rows(load_rows(run)) if r.get("pure/process_return") is not None]
            ret.append(statistics.fmean(pr[-10:]) - statistics.fmean(pr[:10]) if len(pr) >= 20 else None)
        m, se = mean_se(ret)
        print(f"  {arm}: {sum(x is not None for x in col)}/{len(col)} collapsed {col}; process_return change "
              + (f"{m:+.3f} ± {se or 0:.3f}" if m is not None else "-"))


def prm_frozen(out_dir: Path, study) -> None:
    def change(run: Path) -> float:
        acc = {r["step"]: r["prime/dpo_acc"] for r in training_rows(load_rows(run)) if r.get("prime/dpo_acc") is not None}
        first = [acc[s] for s in range(1, 11) if s in acc]
        last = [acc[s] for s in range(study.steps - 9, study.steps + 1) if s in acc]
        return statistics.fmean(last) - statistics.fmean(first)

    deltas = []
    for s, online, frozen in paired_runs(out_dir, study, "prime-online", "prime-frozen"):
        a, b = change(online), change(frozen)
        deltas.append(a - b)
        print(f"  seed {s}: online {a:+.3f}, frozen {b:+.3f}, Δ {a - b:+.3f}")
    m, se = mean_se(deltas)
    say_verdict(f"online − frozen change of prime/dpo_acc over {len(deltas)} seeds", m, se, len(deltas) - 1, +1, 0.05)


def window_mean(run: Path, key: str, first: int, last: int) -> float | None:
    """Mean of `key` over the training rows of steps first ... last that hold it."""
    xs = [r[key] for r in training_rows(load_rows(run)) if first <= r["step"] <= last and r.get(key) is not None]
    return statistics.fmean(xs) if xs else None


def generated_windows(run: Path, width: int = 20) -> dict[int, tuple[float, int]]:
    """step t -> (training accuracy on every generated rollout of steps t-width+1 ... t, before any filter:
    Δ buffer/generated_correct / Δ buffer/generated_samples; and buffer/generated_samples at t), for t ≥ width."""
    n, c = {0: 0}, {0: 0}
    for r in training_rows(load_rows(run)):
        n[r["step"]], c[r["step"]] = r["buffer/generated_samples"], r["buffer/generated_correct"]
    return {t: ((c[t] - c[t - width]) / (n[t] - n[t - width]), n[t])
            for t in sorted(n) if t >= width and t - width in n and n[t] > n[t - width]}


def window_se(windows: dict[int, tuple[float, int]], t: int, width: int = 20) -> float:
    """The binomial standard error of the window ending at step t (its accuracy p over the n samples generated
    in it): how far a window's accuracy moves by sampling alone. `windows` is `generated_windows(run, width)`;
    n is read off the window ending at t - width, so t ≥ 2 × width."""
    p, n = windows[t][0], windows[t][1] - windows[t - width][1]
    return math.sqrt(p * (1 - p) / n)


def never(windows: dict[int, tuple[float, int]], target: float) -> str:
    """'never', with the best of a run's `generated_windows` and how far below the target it stayed."""
    t, (acc, _) = max(windows.items(), key=lambda kv: kv[1][0])
    return f"never (best window {acc:.3f} at step {t}, {target - acc:.3f} short)"


def samples_word(pairs: list[tuple[int | None, int]]) -> str:
    """The rule of steps-opd and steps-credit on (S, N) per seed: S the samples the arm needed to reach the
    baseline's end (None: never), N the baseline's own samples to its end."""
    if all(x is not None and x <= n / 2 for x, n in pairs):
        return "reproduced"
    if all(x is not None and x < n for x, n in pairs):
        return "direction only"
    if all(x is None for x, _ in pairs):
        return "not reproduced"
    return "inconclusive"


def final_sampled(study, arm_name: str, seed: int, run: Path, prompts: int, samples: int) -> dict:
    """pass@k and accuracy of the run's final model on `prompts` held-out prompts × `samples` samples at the
    study's sampling settings (bench/evidence/level_precheck.py's sampler), cached in the run's folder."""
    cache = run / f"final_sampled_{prompts}x{samples}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    from bench.evidence.level_precheck import sampled, study_config

    cfg = study_config(study.name, (f"model.path={run / 'hf' / f'step_{study.steps}'}",), arm=arm_name, seed=seed)
    figures = sampled(cfg, "held_out", prompts, samples)
    cache.write_text(json.dumps(figures))
    return figures


def paired_sampled(out_dir: Path, study, arm: str, base: str, prompts: int, samples: int, keys) -> None:
    """Each key of the final models' sampled figures per arm, and arm − base paired over seeds."""
    both = paired_runs(out_dir, study, arm, base)
    fa = [final_sampled(study, arm, s, ra, prompts, samples) for s, ra, _ in both]
    fb = [final_sampled(study, base, s, rb, prompts, samples) for s, _, rb in both]
    for key in keys:
        m, se = mean_se([x[key] - y[key] for x, y in zip(fa, fb)])
        print(f"  {key} ({prompts} prompts × {samples} samples, {len(both)} seeds): {arm} "
              f"{statistics.fmean(x[key] for x in fa):.3f}, {base} {statistics.fmean(y[key] for y in fb):.3f}, "
              f"Δ {m:+.3f} ± {se or 0:.3f}")


def paired_windows(out_dir: Path, study, arm: str, base: str, key: str, first: int, last: int) -> None:
    pairs = [(window_mean(ra, key, first, last), window_mean(rb, key, first, last))
             for _, ra, rb in paired_runs(out_dir, study, arm, base)]
    pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
    if pairs:
        m, se = mean_se([x - y for x, y in pairs])
        print(f"  {key}, steps {first}-{last}: {arm} {statistics.fmean(x for x, _ in pairs):.3f}, {base} "
              f"{statistics.fmean(y for _, y in pairs):.3f}, Δ {m:+.3f} ± {se or 0:.3f} ({len(pairs)} seeds)")


def none_right_word(pairs, matters: float) -> str:
    """The word when no test has noise to work with (amended 2026-11-29 14:05 UTC, committed 14:07, after
    steps-luffy-beyond5's seeds 0-2 ended at 0.000 in both arms and before seeds 3-4 finished; GRPO's seeds 3-4
    were running, their progress lines at 0.00 seen; LUFFY's had not started): when neither arm answered any held-out
    prompt on any seed, the arm's accuracy is below `none_right_upper(n)` at 95 %, n = the evaluation's prompts
    (the same prompts on every seed, so only they count as independent). Below `matters`, the test could have
    seen the paper's gain and found none: not reproduced; otherwise, and whenever some answer was right,
    inconclusive."""
    if any(a or b for a, b, _, _ in pairs):
        return "inconclusive: every pair equal, so no noise to test against"
    n = min(min(na, nb) for _, _, na, nb in pairs)
    bound = none_right_upper(n)
    if bound < matters:
        return (f"not reproduced: neither arm answered any of the {n} held-out prompts on any seed, so the arm's "
                f"accuracy is below {bound:.3f} (one-sided 95 %, exact binomial) and a gain of {matters:.3f} "
                f"would have been seen")
    return f"inconclusive: 0 of {n} prompts bounds the accuracy only below {bound:.3f}, not below {matters:.3f}"


def final_test(out_dir: Path, study, arm: str, base: str, matters: float, inconclusive_why: str = "") -> None:
    print(f"{arm} − {base}, final held-out greedy accuracy:")
    d = paired_final(out_dir, study, arm, base)
    if d is None:
        print("  fewer than 2 paired seeds: no test")
        return
    if d["df"] is None:  # no noise at all: every pair equal and every accuracy 0 or 1
        print(f"  over {d['seeds']} seeds: Δ {d['delta']:+.3f} on every seed, with no noise to test against")
        print(f"  -> {none_right_word(d['pairs'], matters)}")
        return
    say_verdict(f"  over {d['seeds']} seeds", d["delta"], d["sigma"], d["df"], +1, matters)
    per_prompt_line(out_dir, study, arm, base)
    if inconclusive_why:
        print(f"  -> inconclusive by the registration, whatever the test says: {inconclusive_why}")


def credit(out_dir: Path, study) -> None:
    base = runs(out_dir, study.name, "rloo")
    for s, run in sorted(base.items()):
        start = generated_windows(run, width=10).get(10)
        print(f"  RLOO seed {s}: accuracy on all generated rollouts of steps 1-10 "
              f"{start[0]:.3f} (the precondition: 0.05-0.15)" if start else f"  RLOO seed {s}: no steps 1-10")
    for arm in (a.name for a in study.arms if a.name != "rloo"):
        pairs = []
        for s, run, rloo in paired_runs(out_dir, study, arm, "rloo"):
            base_windows, arm_windows = generated_windows(rloo), generated_windows(run)
            target, total = base_windows[study.steps]
            hit = next((n for _, (acc, n) in sorted(arm_windows.items()) if acc >= target), None)
            pairs.append((hit, total))
            print(f"  seed {s}: RLOO's end {target:.3f} ± {window_se(base_windows, study.steps):.3f} after "
                  f"{total} generated samples; {arm} reached it after "
                  f"{hit if hit is not None else never(arm_windows, target)}")
        if pairs:
            print(f"{arm}: S over {len(pairs)} seeds {[x for x, _ in pairs]} -> {samples_word(pairs)}")
            final_test(out_dir, study, arm, "rloo", 0.05)


def luffy(out_dir: Path, study, sample: bool = False) -> None:
    final_test(out_dir, study, "luffy", "grpo", 0.05)
    for key in ("accuracy/train", "accuracy/train_groups_solved"):
        paired_windows(out_dir, study, "luffy", "grpo", key, study.steps - 49, study.steps)
    if sample:
        paired_sampled(out_dir, study, "luffy", "grpo", 200, 8, ("pass@1", "pass@8"))


def pacs(out_dir: Path, study, sample: bool = False) -> None:
    fell = []
    for s, run in sorted(runs(out_dir, study.name, "grpo").items()):
        first, last = window_mean(run, "entropy", 1, 25), window_mean(run, "entropy", study.steps - 24, study.steps)
        fell.append(last < first)
        print(f"  GRPO seed {s}: entropy {first:.3f} (steps 1-25) -> {last:.3f} (last 25)")
    missed = len(fell) - sum(fell)  # the registration: fell on at least 4 of 5 seeds, so one seed may miss
    state = "absent" if missed > 1 else "holds" if len(fell) >= 5 else "holds so far (4 of 5 needed)"
    print(f"precondition: GRPO's entropy fell on {sum(fell)} of {len(fell)} seeds -> {state}")
    final_test(out_dir, study, "pacs", "grpo", 0.05,
               f"GRPO's entropy fell on {sum(fell)} of {len(fell)} seeds, not at least 4 of 5" if missed > 1 else "")
    paired_windows(out_dir, study, "pacs", "grpo", "entropy", study.steps - 24, study.steps)
    if sample:
        paired_sampled(out_dir, study, "pacs", "grpo", 64, 64, [f"pass@{k}" for k in (1, 2, 4, 8, 16, 32, 64)])


def opd(out_dir: Path, study) -> None:
    total = study.steps * 64
    got = []
    for s, grpo, distilled in paired_runs(out_dir, study, "grpo", "opd"):
        cg, co = curve(grpo, study.steps), curve(distilled, study.steps)
        target = cg[-1]["accuracy"]
        hit = next((c["samples"] for c in co[1:] if c["accuracy"] >= target), None)
        got.append(hit)
        secs = next((c["train_s"] for c in co[1:] if c["accuracy"] >= target), None)
        at = min(cg[-1]["train_s"], co[-1]["train_s"])  # equal training seconds: the shorter run's
        acc_at = [[c for c in cx if c["train_s"] <= at][-1]["accuracy"] for cx in (cg, co)]  # the model then
        print(f"  seed {s}: GRPO's end {target:.3f}; OPD's end {co[-1]['accuracy']:.3f}; "
              f"OPD reached it after {hit if hit is not None else 'never (of ' + str(total) + ')'} samples"
              + (f" and {secs:.0f} training s (GRPO's whole run: {cg[-1]['train_s']:.0f} s)" if secs is not None else "")
              + f"; at equal training seconds ({at:.0f} s) GRPO {acc_at[0]:.3f}, OPD {acc_at[1]:.3f}")
    if not got:
        print("no paired seeds")
        return
    print(f"S over {len(got)} seeds: {got} against GRPO's {total} -> {samples_word([(x, total) for x in got])}")


TESTS = {"steps-hacking-pure": hacking_pure, "steps-prm-frozen": prm_frozen, "steps-opd": opd, "steps-credit": credit}
SAMPLING_TESTS = {"steps-luffy-beyond5": luffy, "steps-pacs5": pacs}  # --sample: also sample the final models


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", required=True, choices=sorted(TESTS | SAMPLING_TESTS))
    p.add_argument("--out-dir", type=Path, default=Path("runs/evidence"))
    p.add_argument("--sample", action="store_true", help="also sample the final models (module docstring)")
    args = p.parse_args(argv)
    study = STUDIES[args.study]
    if args.study in TESTS:
        TESTS[args.study](args.out_dir, study)
    else:
        SAMPLING_TESTS[args.study](args.out_dir, study, sample=args.sample)
    if line := interim(args.out_dir, study):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
