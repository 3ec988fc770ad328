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

    .venv/bin/python bench/evidence/study_tests.py --study steps-hacking-pure --out-dir runs/evidence
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import finished, load_rows, sample_curve, training_rows  # noqa: E402
from bench.common.stats import (  # noqa: E402
    final_prompt_rewards,
    mean_se,
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


def curve(run: Path, steps: int) -> list[dict]:
    """The run's held-out evaluations: [{step, samples, accuracy, eval_n}], step 0 first."""
    return sample_curve(load_rows(run), steps)


def say_verdict(name: str, effect: float, se: float, df: int, sign: int, matters: float) -> None:
    print(f"{name}: {effect:+.3f} ± {se:.3f} -> {verdict(effect, se, df, sign, matters=matters).text()}")


def paired_final(out_dir: Path, study, arm: str, base: str, seeds=None) -> dict | None:
    a, b = runs(out_dir, study.name, arm), runs(out_dir, study.name, base)
    pairs = []
    for s in sorted(set(a) & set(b) & (set(seeds) if seeds is not None else set(a))):
        ca, cb = curve(a[s], study.steps)[-1], curve(b[s], study.steps)[-1]
        pairs.append((ca["accuracy"], cb["accuracy"], ca["eval_n"], cb["eval_n"]))
        print(f"  seed {s}: {arm} {ca['accuracy']:.3f}, {base} {cb['accuracy']:.3f}, Δ {ca['accuracy'] - cb['accuracy']:+.3f}")
    return paired_accuracy_delta(pairs) if len(pairs) >= 2 else None


def hacking_pure(out_dir: Path, study) -> None:
    for name, arm, base, sign in (("T1 sum-prm − min-prm", "sum-prm", "min-prm", -1),
                                  ("T2 sum-mix − sum-prm", "sum-mix", "sum-prm", +1)):
        print(name)
        d = paired_final(out_dir, study, arm, base)
        if d is None:
            print("  fewer than 2 paired seeds: no test")
            continue
        say_verdict(f"  {name} over {d['seeds']} seeds", d["delta"], d["sigma"], d["df"], sign, 0.10)
        unseen = paired_final(out_dir, study, arm, base, seeds=(3, 4) if arm == "sum-prm" else (2, 3, 4))
        if unseen is not None:
            print(f"  on the seeds not seen when the test was registered: Δ {unseen['delta']:+.3f} ± {unseen['sigma']:.3f}")
        a, b = runs(out_dir, study.name, arm), runs(out_dir, study.name, base)
        common = sorted(set(a) & set(b))
        if common:
            per_prompt = [(final_prompt_rewards(a[s]), final_prompt_rewards(b[s])) for s in common]
            keys = sorted(set.intersection(*(set(x) & set(y) for x, y in per_prompt)))
            xs = [statistics.fmean(x[k] for x, _ in per_prompt) for k in keys]
            ys = [statistics.fmean(y[k] for _, y in per_prompt) for k in keys]
            boot = paired_bootstrap(xs, ys)
            print(f"  per-prompt paired bootstrap pooled over {len(common)} seeds ({len(keys)} prompts): {boot}")
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

    on, fr = runs(out_dir, study.name, "prime-online"), runs(out_dir, study.name, "prime-frozen")
    deltas = []
    for s in sorted(set(on) & set(fr)):
        a, b = change(on[s]), change(fr[s])
        deltas.append(a - b)
        print(f"  seed {s}: online {a:+.3f}, frozen {b:+.3f}, Δ {a - b:+.3f}")
    m, se = mean_se(deltas)
    say_verdict(f"online − frozen change of prime/dpo_acc over {len(deltas)} seeds", m, se, len(deltas) - 1, +1, 0.05)


def opd(out_dir: Path, study) -> None:
    g, o = runs(out_dir, study.name, "grpo"), runs(out_dir, study.name, "opd")
    total = study.steps * 64
    got = []
    for s in sorted(set(g) & set(o)):
        target = curve(g[s], study.steps)[-1]["accuracy"]
        co = curve(o[s], study.steps)
        hit = next((c["samples"] for c in co[1:] if c["accuracy"] >= target), None)
        got.append(hit)
        cg = curve(g[s], study.steps)
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
    print(f"S over {len(got)} seeds: {got} against GRPO's {total} -> {opd_word(got, total)}")


def opd_word(samples: list[int | None], total: int) -> str:
    """steps-opd's registered rule on S per seed (None: OPD never reached GRPO's end) against GRPO's `total`."""
    if all(x is not None and x <= total / 2 for x in samples):
        return "reproduced"
    if all(x is not None and x < total for x in samples):
        return "direction only"
    if all(x is None for x in samples):
        return "not reproduced"
    return "inconclusive"


TESTS = {"steps-hacking-pure": hacking_pure, "steps-prm-frozen": prm_frozen, "steps-opd": opd}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", required=True, choices=sorted(TESTS))
    p.add_argument("--out-dir", type=Path, default=Path("runs/evidence"))
    args = p.parse_args(argv)
    TESTS[args.study](args.out_dir, STUDIES[args.study])
    return 0


if __name__ == "__main__":
    sys.exit(main())
