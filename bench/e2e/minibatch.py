"""Mini-batches × epochs on the quick-start: does the run learn, and does the trust region act?

Reads finished `algo-train` run folders (one per seed) and prints, per run, held-out greedy accuracy
before RL and every 50 steps, the means over the run of pg/clipfrac, pg/ppo_kl, is/ess and
time/train_s, then writes a PNG of accuracy against learner steps beside the quick-start default's
recorded curves (the one-optimiser-step table of bench/RESULTS.md, seeds 0–2, evaluated every 50 steps).

Runs (≈ 8–12 min each on 2 cores):
  for s in 0 1 2; do .venv/bin/algo-train --algo grpo --set learner.mini_batches=4 --set learner.epochs=2 \\
      --set seed=$s --output runs/mb4e2-s$s; done
  .venv/bin/python bench/e2e/minibatch.py runs/mb4e2-s0 runs/mb4e2-s1 runs/mb4e2-s2 --png bench/minibatch_curves.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import eval_curve, fmt, load_rows, markdown_table, mean_over, training_rows  # noqa: E402

# bench/RESULTS.md "Quick-start learning": `algo-train --algo grpo` (one optimiser step per learner step)
DEFAULT_CURVES = {
    0: [(0, 0.185), (50, 0.415), (100, 0.410), (150, 0.565), (200, 0.610), (250, 0.650), (300, 0.700), (350, 0.710)],
    1: [(0, 0.345), (50, 0.490), (100, 0.465), (150, 0.475), (200, 0.600), (250, 0.655), (300, 0.665), (350, 0.660)],
    2: [(0, 0.420), (50, 0.475), (100, 0.480), (150, 0.465), (200, 0.505), (250, 0.555), (300, 0.585), (350, 0.575)],
}
MARKS = (0, 50, 100, 150, 200, 250, 300, 350)


def summarise(run: Path) -> dict:
    rows = load_rows(run)
    train = training_rows(rows)
    curve = {step: acc for step, acc, _ in eval_curve(rows)}
    return {
        "run": str(run), "steps": len(train), "curve": curve,
        "clipfrac": mean_over(train, "pg/clipfrac"), "ppo_kl": mean_over(train, "pg/ppo_kl"),
        "ess": mean_over(train, "is/ess"), "train_s": mean_over(train, "time/train_s"),
        "updates": mean_over(train, "optim/updates_per_step"),
        "clipfrac_positive": sum(1 for r in train if (r.get("pg/clipfrac") or 0) > 0) / max(len(train), 1),
    }


def plot(results: list[dict], seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for res, seed in zip(results, seeds):
        pts = sorted(res["curve"].items())
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"mini_batches 4 × epochs 2, seed {seed}")
        if seed in DEFAULT_CURVES:
            d = DEFAULT_CURVES[seed]
            ax.plot([p[0] for p in d], [p[1] for p in d], "--", color=line.get_color(), alpha=0.7,
                    label=f"default (1 optimiser step), seed {seed}")
    ax.set_xlabel("learner steps (weight versions)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("quick-start GRPO: 8 optimiser steps per batch vs 1")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="finished run folders, one per seed")
    p.add_argument("--seeds", nargs="+", type=int, help="seed of each run (default: read from its config.yaml)")
    p.add_argument("--png", type=Path, help="write the curves here")
    args = p.parse_args(argv)
    import yaml

    seeds = args.seeds or [int(yaml.safe_load((r / "config.yaml").read_text())["seed"]) for r in args.runs]
    results = [summarise(r) | {"seed": s} for r, s in zip(args.runs, seeds)]
    for res in results:
        print(json.dumps({k: v for k, v in res.items() if k != "curve"} | {"curve": sorted(res["curve"].items())}))
    header = ["seed", *[f"step {m}" for m in MARKS], "gain", "mean pg/clipfrac", "rows with clipfrac > 0",
              "mean pg/ppo_kl", "mean is/ess", "train_s/step"]
    table = []
    for res in results:
        c = res["curve"]
        gain = (c.get(max(c)) - c.get(0)) * 100 if c and 0 in c else None
        table.append([str(res["seed"]), *[fmt(c.get(m)) for m in MARKS], fmt(gain, "+.1f"),
                      fmt(res["clipfrac"], ".4f"), fmt(res["clipfrac_positive"], ".2f"), fmt(res["ppo_kl"], ".2e"),
                      fmt(res["ess"], ".4f"), fmt(res["train_s"], ".2f")])
    print(markdown_table(header, table))
    finals = [res["curve"][max(res["curve"])] for res in results if res["curve"]]
    if finals:
        print(f"final accuracy mean {statistics.mean(finals):.3f} over {len(finals)} seeds")
    if args.png:
        plot(results, seeds, args.png)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
