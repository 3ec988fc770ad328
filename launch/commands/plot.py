"""`algo-train plot RUN_DIR [RUN_DIR ...] [-o OUT.png]`: reward, accuracy and staleness curves, against the
learner step (a metrics.jsonl row's `step`: one weight push, which is `learner.mini_batches × epochs`
optimiser steps)."""

from __future__ import annotations

import argparse
from pathlib import Path

PANELS = [("reward/mean", "train reward"), ("eval/accuracy", "held-out accuracy"),
          ("staleness/mean", "staleness (versions)")]


def plot_runs(run_dirs: list[str], out: str) -> Path:
    import matplotlib

    from launch.loop.metrics import read_metrics

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6))
    for run in run_dirs:
        rows = read_metrics(run)
        label = Path(run).name
        for ax, (key, _) in zip(axes, PANELS):
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if key == "eval/accuracy" else None, ms=3, label=label)
    for ax, (_, title) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    from launch.commands.run_flags import Parser

    p = Parser(prog="algo-train plot", description="Plot reward/accuracy/staleness of runs against the learner step.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("-o", "--output", default=None, help="PNG path (default RUN_DIR/curves.png of the first run)")
    return p


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """`algo-train plot` with its parsed flags; returns the exit status."""
    out = args.output or str(Path(args.runs[0]) / "curves.png")
    try:
        path = plot_runs(args.runs, out)
    except FileNotFoundError as e:
        print(f"algo-train plot: {e}")
        return 2
    print(f"wrote {path}")
    return 0
