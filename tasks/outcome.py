"""The verifiable (outcome) reward: one rule for the synthetic arithmetic task and for math.

Why one rule: actors score every response the same way whatever the dataset. Rule (`boxed_reward`):
take the last ``\\boxed{}`` of the response (none or empty: 0.0). If it and the ground truth are both
plain integers, compare them as integers -- exact, and no worker process, which is every case of the
synthetic task. Otherwise an equivalence check decides: math-verify under a time limit
(`tasks.math_answers`) for `reward`, math-verify called directly inside the reward worker for the
`math_verify` reward of `tasks.rewards`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tasks.boxed import last_boxed
from tasks.math_answers import default_verifier

_INTEGER = re.compile(r"[+-]?\d+")


def boxed_reward(response_text: str, ground_truth: str, equivalent: Callable[[str, str], bool]) -> float:
    """1.0 if the final boxed answer of `response_text` equals `ground_truth`, else 0.0; integers are
    compared exactly, anything else by `equivalent(answer, ground_truth)`."""
    pred = last_boxed(response_text)
    if pred is None or not pred.strip():
        return 0.0
    if _INTEGER.fullmatch(pred.strip()) and _INTEGER.fullmatch(ground_truth.strip()):
        return float(int(pred) == int(ground_truth))
    return float(equivalent(pred, ground_truth))


def reward(response_text: str, ground_truth: str, timeout_s: float | None = None) -> float:
    """`boxed_reward` with math-verify in the process-wide `MathVerifier` worker. timeout_s bounds the
    math-verify call (default `MathVerifier.timeout_s`, 5 s); a timeout scores 0."""
    return boxed_reward(response_text, ground_truth,
                        lambda pred, gold: default_verifier().equivalent(pred, gold, timeout_s))
