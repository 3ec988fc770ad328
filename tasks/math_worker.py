"""math-verify itself, for a `tasks.worker` child process only: `equivalent` (what
`tasks.math_answers.MathVerifier` calls) and `score` (the `math_verify` reward of `tasks.rewards`).

Why only in a worker: math-verify's own time limit is `signal.alarm` (main thread only) and cannot stop
long C-level work, so its calls here run with that limit off and the worker's parent enforces one by
killing the process. math-verify is imported here, at load, so a worker pays the import (seconds) while
starting, not inside its first call's time limit.
"""

from __future__ import annotations

import logging

from math_verify import parse, verify

from tasks.outcome import boxed_reward

logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # silences the "timeout disabled" notes


def equivalent(pred: str, gold: str) -> bool:
    """True iff math-verify finds ``\\boxed{pred}`` equal to ``\\boxed{gold}`` (False when either does not
    parse, or math-verify raises on malformed LaTeX: that answer is simply wrong)."""
    try:
        g = parse("\\boxed{" + gold + "}", parsing_timeout=None)
        p = parse("\\boxed{" + pred + "}", parsing_timeout=None)
        return bool(g and p and verify(g, p, timeout_seconds=None))
    except Exception:
        return False


def score(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """The `math_verify` reward: `tasks.outcome.boxed_reward` with math-verify deciding non-integers."""
    return boxed_reward(response, ground_truth, equivalent)
