"""Rule-based step checker: PURE's process reward for the synthetic arithmetic task.

Why: PURE needs a score p_k in [-1, 1] for every step of a response. On a laptop there is no 7B PRM, but
the arithmetic task (`tasks.arithmetic`) has a reference solution whose work steps a rule can judge
exactly. `score_steps` has the PRM interface of ALGORITHMS.md, so the learner can swap it for a
model-based PRM.

The rule, per step (whitespace inside a step is ignored):

* empty step (whitespace only, e.g. the "" step a response ending in "\\n\\n" + eos leaves, or a
  "\\n\\n" that follows another "\\n\\n"): ignored -- no score at all (`None`, see `score_steps`), and it
  changes nothing for the other steps;
* final-answer step (contains ``\\boxed``): +1 if the boxed content is an integer equal to the answer,
  else -1 (wherever the step sits in the response);
* equation step (digits joined by ``+ - *``, ``=``, digits, optionally ``, digits``): matched by
  *content* against the reference's work steps (the solution without its ``\\boxed`` step). It is +1 iff
  it equals a reference work step that comes after the last one matched so far (the first match may be
  any reference step); that step becomes the last matched one. Otherwise -1: a false equation, a wrong
  operand, a wrong carry, a wrong digit written so far, a step the reference does not have, a repeat of
  an already matched step, or a reference step written out of order;
* anything else (prose, cut off mid-step): 0, there is no claim to judge, and it shifts nothing.

Why order matters: a column step states the carry it received and the digits written so far, and a
multiplication step adds a running total -- each is derived from the steps before it. A step written
before the step it depends on was not derived from it, and a repeated step adds no new work (with
`uniform` or `gamma` credit each +1 adds to the return, so repeats would be paid). Skipped reference
steps are not penalised: the steps that follow are still true claims of the reference, and a skipped
column's digit still has to appear in the next step's digits written so far.

So a slip is -1 at the step where it happens and at every later step that carries it forward (its
operands, carry or written digits then differ from every reference step); a prose line between steps
costs nothing.

Deviations from the reference: PURE scores steps with a trained PRM (p = softmax[1] - softmax[0], one
score for every step, empty ones included); this rule stands in for it on the synthetic task, with
scores in {-1, 0, +1} and no score for an empty step.
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


def answer_score(problem: Problem, step: str) -> float:
    """+1 if the last ``\\boxed{}`` of `step` holds an integer equal to the problem's answer, else -1."""
    content = last_boxed(step)
    ok = content is not None and _INTEGER.fullmatch(content.strip()) is not None
    return 1.0 if ok and int(content) == problem.value else -1.0


def judge_steps(problem: Problem, steps: Sequence[str]) -> list[float | None]:
    """Scores of the step strings `steps` of one response, in order (rule in the module docstring).

    The matching state is `next_ref`: the index of the first reference work step an equation step may
    still match (0 at the start; j + 1 after a match with reference step j).
    """
    work = [_squeeze(s) for s in problem.steps[:-1]]
    next_ref = 0
    out: list[float | None] = []
    for step in steps:
        claim = _squeeze(step)
        if not claim:
            out.append(None)
        elif "\\boxed" in step:
            out.append(answer_score(problem, step))
        elif not _EQUATION.fullmatch(claim):
            out.append(0.0)
        elif claim in work[next_ref:]:
            next_ref = work.index(claim, next_ref) + 1
            out.append(1.0)
        else:
            out.append(-1.0)
    return out


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
) -> list[float | None]:
    """p_k for each given step of `response`: one entry per element of `step_spans`, in the same order.

    problem: a `Problem` or its prompt text (chat-templated prompts are fine).
    step_spans: (start, end) character spans into `response`, or the step strings themselves.

    Return contract: entry k is +1.0, 0.0 or -1.0 for a judged step (module docstring), or None for an
    ignored (empty / whitespace-only) step. A None step has no score: a caller building PURE's
    step-end mask must leave that step's end unmarked (no step there), not score it 0 -- a 0 would take
    almost all the min-form weight from a response whose other steps are all +1. Positions stay aligned
    with `step_spans`, so the caller can zip spans and scores and drop the None pairs.
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
    return judge_steps(p, steps)
