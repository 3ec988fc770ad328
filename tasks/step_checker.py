"""Rule-based step checker: PURE's process reward for the synthetic arithmetic task.

Why: PURE needs a score p_k in [-1, 1] for every step of a response. On a laptop there is no 7B PRM, but
the arithmetic task (`tasks.arithmetic`) has a reference step for every position, so a rule can judge
each step exactly. `score_steps` has the PRM interface of ALGORITHMS.md, so the learner can swap it for
a model-based PRM.

The rule, per step k (whitespace inside the step is ignored):

* final-answer step (contains ``\\boxed``): +1 if the boxed content is an integer equal to the answer,
  else -1 (wherever the step sits in the response);
* equation step (digits joined by ``+ - *``, ``=``, digits, optionally ``, digits``): +1 if it is the
  reference's step k (same operands, carry/borrow, result and digits written so far), else -1 -- a
  false equation, a wrong operand, a wrong carry, or a step the reference does not have;
* anything else (empty, prose, cut off mid-step): 0, there is no claim to judge.

So a slip is -1 at the step where it happens and at every later step that carries it forward.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tasks.arithmetic import Problem
from tasks.boxed import last_boxed

_EQUATION = re.compile(r"\d+(?:[+\-*]\d+)+=\d+(?:,\d+)?")
_INTEGER = re.compile(r"-?\d+")


def _squeeze(text: str) -> str:
    return "".join(text.split())


def step_score(problem: Problem, step: str, k: int) -> float:
    """Score of one step `step` found at position `k` of a response to `problem` (rule above)."""
    if "\\boxed" in step:
        content = last_boxed(step)
        ok = content is not None and _INTEGER.fullmatch(content.strip()) is not None
        return 1.0 if ok and int(content) == problem.value else -1.0
    claim = _squeeze(step)
    if not _EQUATION.fullmatch(claim):
        return 0.0
    work = problem.steps[:-1]
    return 1.0 if k < len(work) and claim == _squeeze(work[k]) else -1.0


def split_steps(response: str) -> list[tuple[int, int]]:
    """Character spans of the steps of `response`: cut after every "\\n\\n" (the separator stays with
    the step it ends), plus the tail if non-empty. A helper for callers that have only text."""
    spans, start = [], 0
    for m in re.finditer("\n\n", response):
        spans.append((start, m.end()))
        start = m.end()
    if start < len(response):
        spans.append((start, len(response)))
    return spans


def score_steps(
    problem: Problem | str, response: str, step_spans: Sequence[tuple[int, int]] | Sequence[str]
) -> list[float]:
    """p_k in {-1, 0, +1} for each step of `response` (see the module docstring for the rule).

    problem: a `Problem` or its prompt text (chat-templated prompts are fine).
    step_spans: (start, end) character spans into `response`, or the step strings themselves.
    """
    p = problem if isinstance(problem, Problem) else Problem.from_prompt(problem)
    steps = []
    for span in step_spans:
        if isinstance(span, str):
            steps.append(span)
            continue
        start, end = span
        if not 0 <= start <= end <= len(response):
            raise ValueError(f"step span {span} outside the response (length {len(response)})")
        steps.append(response[start:end])
    return [step_score(p, s, k) for k, s in enumerate(steps)]
