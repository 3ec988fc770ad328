"""Arithmetic problems as dataset records, and noisy demonstrations for SFT warm-up and LUFFY.

Why noisy: the quick-start warms the tiny model up with SFT so that it starts at a middling accuracy
that RL must then raise. Demonstrations with a controlled share of slips (a wrong digit or a wrong
carry/borrow, carried forward consistently: `tasks.arithmetic.solve`) cap what imitation alone can
reach, and give PURE's step checker real errors to find. The same records, written with
`tasks.records.write_records`, are LUFFY teacher files in the veRL layout (JSONL or parquet).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from tasks.arithmetic import Problem, random_fault, solve
from tasks.records import Record, write_records

DATA_SOURCE = "synthetic_arithmetic"


def noisy_solution(problem: Problem, error_rate: float, rng: random.Random) -> tuple[str, bool]:
    """The reference solution, or with probability `error_rate` one with a random fault injected.
    Returns (solution text, whether a fault was injected)."""
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
    if rng.random() >= error_rate:
        return problem.solution, False
    return "\n\n".join(solve(problem, random_fault(problem, rng))), True


def problem_records(problems: Sequence[Problem], split: str) -> list[Record]:
    """RL prompts: one record per problem, ground truth = the exact answer, no target."""
    return [
        Record(
            prompt=[{"role": "user", "content": p.prompt}],
            ground_truth=p.answer,
            data_source=DATA_SOURCE,
            ability="arithmetic",
            extra_info={"split": split, "index": i},
        )
        for i, p in enumerate(problems)
    ]


def demonstration_records(
    problems: Sequence[Problem], *, error_rate: float = 0.2, seed: int = 0, split: str = "train"
) -> list[Record]:
    """`problem_records` with a (possibly faulty) solution as target; ``extra_info.corrupted`` marks
    the faulty ones. Deterministic in `seed`."""
    rng = random.Random(seed)
    records = problem_records(problems, split)
    for record, problem in zip(records, problems, strict=True):
        record.target, corrupted = noisy_solution(problem, error_rate, rng)
        record.extra_info["corrupted"] = corrupted
    return records


def write_teacher_file(
    path: str | Path, problems: Sequence[Problem], *, error_rate: float = 0.2, seed: int = 0
) -> Path:
    """Write a LUFFY/SFT teacher file (``.jsonl`` or ``.parquet``) of noisy demonstrations."""
    return write_records(path, demonstration_records(problems, error_rate=error_rate, seed=seed))
