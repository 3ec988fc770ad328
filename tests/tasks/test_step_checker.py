"""The rule-based step checker (PURE's process reward on the synthetic task)."""

import math
import random

import pytest
import torch

from algos.pure.steps import minform_rewards
from tasks.arithmetic import Fault, Problem, random_fault, solve
from tasks.step_checker import score_steps, split_steps

P = Problem(457, "+", 386)  # reference: 7+6+0=13, 3 | 5+8+1=14, 43 | 4+3+1=8, 843 | \boxed{843}


def scores(response: str, problem=P) -> list[float]:
    return score_steps(problem, response, split_steps(response))


def test_reference_solution_scores_all_ones():
    assert scores(P.solution) == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "response, expected",
    [
        # false sum in column 0 (7+6 is 13, not 12); later steps carry the slip in the digits written
        # so far (42, 842 instead of 43, 843)
        ("7+6+0=12, 2\n\n5+8+1=14, 42\n\n4+3+1=8, 842\n\n\\boxed{842}", [-1, -1, -1, -1]),
        # dropped carry: 5+8+0=13 is true arithmetic but the carry-in must be 1
        ("7+6+0=13, 3\n\n5+8+0=13, 33\n\n4+3+1=8, 833\n\n\\boxed{833}", [1, -1, -1, -1]),
        # prose and a cut-off step are not judged (0), the whitespace-only "\n\n" step is ignored (None);
        # the answer is right (+1)
        ("Let me add.\n\n\n\n7+6+0=\n\n\\boxed{843}", [0, None, 0, 1]),
        # a prose step first does not shift the correct steps after it (matched by content, not position:
        # the positional checker scored this [0, -1, -1, -1, 1])
        ("Column by column.\n\n7+6+0=13, 3\n\n5+8+1=14, 43\n\n4+3+1=8, 843\n\n\\boxed{843}", [0, 1, 1, 1, 1]),
        # ... nor does it excuse a false step after it: 7+6 is 13, and 42, 842 carry the slip
        ("Units first.\n\n7+6+0=12, 2\n\n5+8+1=14, 42\n\n4+3+1=8, 842\n\n\\boxed{842}", [0, -1, -1, -1, -1]),
        # a repeated step earns nothing (-1); the next reference step still matches
        ("7+6+0=13, 3\n\n7+6+0=13, 3\n\n5+8+1=14, 43\n\n4+3+1=8, 843\n\n\\boxed{843}", [1, -1, 1, 1, 1]),
        # out of order: after column 1 matched, column 0 lies before it (-1); column 2 follows (+1)
        ("5+8+1=14, 43\n\n7+6+0=13, 3\n\n4+3+1=8, 843\n\n\\boxed{843}", [1, -1, 1, 1]),
        # a skipped column is not penalised: column 2 is still a true reference step
        ("7+6+0=13, 3\n\n4+3+1=8, 843\n\n\\boxed{843}", [1, 1, 1]),
        # spaces inside a step are ignored; an extra equation step is not in the reference (-1)
        (
            " 7 + 6 + 0 = 13 , 3 \n\n5+8+1=14, 43\n\n4+3+1=8, 843\n\n1+1+1=3, 3\n\n\\boxed{ 843 }",
            [1, 1, 1, -1, 1],
        ),
        # a non-integer or wrong final answer is -1
        ("\\boxed{eight hundred}", [-1]),
        ("\\boxed{844}", [-1]),
    ],
)
def test_golden_scores(response, expected):
    assert scores(response) == expected


def test_multiplication_slip_carried_into_the_running_total():
    # 457*38, reference 457*8=3656 | 457*30=13710 | 3656+13710=17366 | \boxed{17366}; the first partial
    # product is off by one (3657): its own step and the sum and answer that use it are -1, the other
    # partial product (457*30=13710) does not depend on it and stays +1
    response = "457*8=3657\n\n457*30=13710\n\n3657+13710=17367\n\n\\boxed{17367}"
    assert scores(response, Problem(457, "*", 38)) == [-1, 1, -1, -1]


def test_empty_final_step_is_ignored_and_min_form_stays_one():
    # a response ending in "\n\n" then eos: the learner's token-level split gives a last step of zero
    # characters (the eos decodes to ""), span (n, n)
    response = P.solution + "\n\n"
    n = len(response)
    spans = split_steps(response) + [(n, n)]
    p = score_steps(P, response, spans)
    assert p == [1.0, 1.0, 1.0, 1.0, None]
    # min-form total sum_k softmax(-p/T)_k p_k over the scored steps, T = 0.1: four steps of +1 get
    # 1/4 each -> 4 * 1/4 * 1 = 1. Had the empty step scored 0 it would take
    # 1 / (1 + 4 e^-10) = 0.99982 of the weight and the total would be 4 e^-10 / (1 + 4 e^-10) = 1.8e-4.
    kept = torch.tensor([[s for s in p if s is not None]])
    assert minform_rewards(kept, torch.ones_like(kept, dtype=torch.bool)).sum().item() == pytest.approx(1.0)
    with_zero = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    assert minform_rewards(with_zero, torch.ones(1, 5, dtype=torch.bool)).sum().item() == pytest.approx(
        4 * math.exp(-10) / (1 + 4 * math.exp(-10)))


def test_spans_strings_and_prompt_text_agree():
    response = P.solution
    spans = split_steps(response)
    assert spans[:2] == [(0, 13), (13, 27)]  # "7+6+0=13, 3\n\n" is 13 characters
    texts = [response[s:e] for s, e in spans]
    assert score_steps(P, response, spans) == score_steps(f"<|user|>{P.prompt}", response, texts)


def test_span_outside_response_is_an_error():
    with pytest.raises(ValueError, match="outside the response"):
        score_steps(P, "abc", [(0, 5)])


@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_injected_fault_is_the_first_negative_step(op):
    rng = random.Random(op)
    for _ in range(200):
        a, b = rng.randint(0, 9999), rng.randint(0, 999)
        p = Problem(max(a, b), op, min(a, b))
        fault = random_fault(p, rng)
        response = "\n\n".join(solve(p, fault))
        s = scores(response, p)
        first_bad = s.index(-1.0)
        # a digit slip shows in its own step, a carry slip in the next column
        assert first_bad == fault.step + (fault.kind == "carry")
        assert all(x == 1.0 for x in s[:first_bad]) and s[-1] == -1.0


def test_wrong_carry_example():
    # 523-187 with the borrow out of column 0 forgotten: 12-8-0=4 instead of 12-8-1=3
    response = "\n\n".join(solve(Problem(523, "-", 187), Fault(0, "carry")))
    assert response.split("\n\n")[1] == "12-8-0=4, 46"
    assert scores(response, Problem(523, "-", 187)) == [1, -1, -1, -1]
