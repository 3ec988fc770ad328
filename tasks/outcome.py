"""The verifiable (outcome) reward: one function for the synthetic arithmetic task and for math.

Why one function: actors score every response the same way whatever the dataset. Rule: take the last
``\\boxed{}`` of the response (none: 0.0). If it and the ground truth are both plain integers, compare
them as integers -- exact, and no worker process, which is every case of the synthetic task. Otherwise
math-verify decides under a time limit (`tasks.math_answers`).
"""

from __future__ import annotations

import re

from tasks.boxed import last_boxed
from tasks.math_answers import math_reward

_INTEGER = re.compile(r"[+-]?\d+")


def reward(response_text: str, ground_truth: str, timeout_s: float | None = None) -> float:
    """1.0 if the final boxed answer of `response_text` equals `ground_truth`, else 0.0.

    timeout_s bounds the math-verify call (default `MathVerifier.timeout_s`, 5 s); a timeout scores 0.
    """
    pred = last_boxed(response_text)
    if pred is None:
        return 0.0
    if _INTEGER.fullmatch(pred.strip()) and _INTEGER.fullmatch(ground_truth.strip()):
        return float(int(pred) == int(ground_truth))
    return math_reward(response_text, ground_truth, timeout_s)
