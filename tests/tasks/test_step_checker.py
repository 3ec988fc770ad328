"""The rule-based step checker (PURE's process reward on the synthetic task)."""

import random

import pytest

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
        # prose, an empty step and a cut-off step are not judged (0); the answer is right (+1)
        ("Let me add.\n\n\n\n7+6+0=\n\n\\boxed{843}", [0, 0, 0, 1]),
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
