"""What the responses of runs look like over training: the PURE paper's hacking measurements (§5.1).

Reads the sample dumps of run folders (`samples.jsonl`: a few responses per step, docs/metrics.md) and,
per window of learner steps, for the built-in arithmetic task (tasks.step_checker judges every step):
  boxed      share of responses with a \\boxed{} answer step;
  truncated  share cut at the length limit (finish_reason "length");
  right / wrong / no-claim steps per response (checker +1 / −1 / 0: a step that is not an equation);
  correct    share the verifier scores 1.
Runs of one arm are pooled. One table row per (arm, window):

  .venv/bin/python bench/evidence/response_shapes.py --window 20 runs/evidence/steps-hacking/pure-{min,sum}-s*
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common.runs import markdown_table  # noqa: E402


def shape(sample: dict) -> dict[str, float]:
    """The measurements of one dumped sample."""
    from tasks.step_checker import score_steps, split_steps

    response = sample["response"]
    verdicts = [v for v in score_steps(sample["prompt"], response, split_steps(response)) if v is not None]
    return {"boxed": float("\\boxed" in response), "truncated": float(sample.get("finish_reason") == "length"),
            "right": float(verdicts.count(1.0)), "wrong": float(verdicts.count(-1.0)),
            "no-claim": float(verdicts.count(0.0)), "correct": float(sample["reward"] >= 1.0)}


def arm_of(run_dir: Path) -> str:
    return re.sub(r"-s\d+$", "", run_dir.name)


def table(run_dirs: list[Path], window: int) -> str:
    pooled: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for run in run_dirs:
        for line in (run / "samples.jsonl").read_text().splitlines():
            sample = json.loads(line)
            pooled[arm_of(run), (sample["step"] - 1) // window].append(shape(sample))
    keys = ["boxed", "truncated", "right", "wrong", "no-claim", "correct"]
    rows = [[arm, f"{w * window + 1}–{(w + 1) * window}", str(len(got)),
             *(f"{sum(g[k] for g in got) / len(got):.2f}" for k in keys)]
            for (arm, w), got in sorted(pooled.items())]
    heads = ["arm", "steps", "samples", "boxed", "truncated", "right steps", "wrong steps", "no-claim steps",
             "correct"]
    return markdown_table(heads, rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders (arm = folder name without -s<seed>)")
    p.add_argument("--window", type=int, default=20, help="learner steps per table row")
    args = p.parse_args(argv)
    print(table(args.runs, args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
