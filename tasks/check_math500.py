"""Check the math rewards on real data: MATH-500 solutions against their own and perturbed answers.

Why: a reward that rejects correct solutions or accepts wrong answers silently ruins RL. Every MATH-500
worked solution ends in a boxed answer, so `reward(solution, answer)` should be 1 and
`reward(solution, perturb(answer))` should be 0. Results and explanations: tasks/MATH500_CHECK.md.

    python -m tasks.check_math500 [--data /work/shared/data/math500.jsonl] [--limit N]

prints a JSON summary: acceptance and rejection rates for `tasks.outcome.reward` (math-verify) and for
`tasks.hendrycks.hendrycks_score`, the failing ids, and the cost per math-verify call in the worker
process and, for comparison, in-process on the main thread.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from tasks.boxed import last_boxed
from tasks.hendrycks import hendrycks_score
from tasks.loaders import MATH500_FIELDS, load_records
from tasks.math_answers import default_verifier
from tasks.outcome import reward
from tasks.records import Record

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "math500.jsonl"


def perturb(answer: str) -> str:
    """A wrong answer near `answer`: the next choice letter for ``(A)``-``(D)``, else the last digit
    plus one (mod 10), else ``answer+1``."""
    choice = re.fullmatch(r"\(([A-D])\)", answer)
    if choice:
        return f"({chr(ord(choice[1]) + 1)})"
    digits = list(re.finditer(r"\d", answer))
    if digits:
        i = digits[-1].start()
        return answer[:i] + str((int(answer[i]) + 1) % 10) + answer[i + 1 :]
    return answer + "+1"


def check(records: list[Record]) -> dict:
    """Rates and failures of both scorers on `records` (prompt=problem, target=solution)."""
    from math_verify import parse, verify

    summary: dict = {"n": len(records)}
    for name, score in (("math_verify", reward), ("hendrycks", hendrycks_score)):
        t0 = time.perf_counter()
        own = [score(r.target, r.ground_truth) for r in records]
        wrong = [score(r.target, perturb(r.ground_truth)) for r in records]
        seconds = time.perf_counter() - t0
        summary[name] = {
            "accept_own": sum(own) / len(records),
            "reject_perturbed": 1 - sum(wrong) / len(records),
            "own_failures": [_case(r) for r, s in zip(records, own) if s != 1.0],
            "perturbed_accepted": [
                _case(r, perturb(r.ground_truth)) for r, s in zip(records, wrong) if s != 0.0
            ],
            "ms_per_call": 1000 * seconds / (2 * len(records)),
        }

    pairs = [(last_boxed(r.target) or "", r.ground_truth) for r in records]
    verifier = default_verifier()
    t0 = time.perf_counter()
    for pred, gold in pairs:
        verifier.equivalent(pred, gold)
    worker_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for pred, gold in pairs:
        verify(parse("\\boxed{" + gold + "}"), parse("\\boxed{" + pred + "}"))
    inline_s = time.perf_counter() - t0
    summary["cost_ms_per_call"] = {
        "worker_process": 1000 * worker_s / len(pairs),
        "in_process_main_thread": 1000 * inline_s / len(pairs),
    }
    summary["worker_timeouts"] = verifier.timeouts
    return summary


def _case(r: Record, answer: str | None = None) -> dict:
    return {
        "id": r.extra_info.get("id", ""),
        "answer": answer or r.ground_truth,
        "boxed": last_boxed(r.target),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit", type=int, default=None, help="check only the first N problems")
    args = parser.parse_args(argv)
    records = load_records(args.data, MATH500_FIELDS)[: args.limit]
    summary = check(records)
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
