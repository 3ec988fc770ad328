"""The synthetic arithmetic task: golden solutions, faults, determinism and disjoint splits."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.arithmetic import (
    ArithmeticConfig,
    Fault,
    Problem,
    make_splits,
    random_fault,
    sample_problems,
    solve,
)


@pytest.mark.parametrize(
    "problem, steps",
    [
        # 457+386: 7+6=13 write 3 carry 1; 5+8+1=14 write 4 carry 1; 4+3+1=8 -> 843
        (Problem(457, "+", 386), ("7+6+0=13, 3", "5+8+1=14, 43", "4+3+1=8, 843", "\\boxed{843}")),
        # 957+86: the last column writes its whole sum 9+0+1=10 -> 1043
        (Problem(957, "+", 86), ("7+6+0=13, 3", "5+8+1=14, 43", "9+0+1=10, 1043", "\\boxed{1043}")),
        # 523-187: 3<7 borrow: 13-7=6; 2-8-1<0 borrow: 12-8-1=3; 5-1-1=3 -> 336
        (Problem(523, "-", 187), ("13-7-0=6, 6", "12-8-1=3, 36", "5-1-1=3, 336", "\\boxed{336}")),
        # 100-99: 10-9=1; 10-9-1=0; 1-0-1=0 -> "001" = 1
        (Problem(100, "-", 99), ("10-9-0=1, 1", "10-9-1=0, 01", "1-0-1=0, 001", "\\boxed{1}")),
        # 457*38: 457*8=3656; 457*30=13710; 3656+13710=17366
        (Problem(457, "*", 38), ("457*8=3656", "457*30=13710", "3656+13710=17366", "\\boxed{17366}")),
        # 12*10: the zero digit of b gets no step; 12*10=120
        (Problem(12, "*", 10), ("12*10=120", "\\boxed{120}")),
        (Problem(7, "*", 0), ("7*0=0", "\\boxed{0}")),
    ],
)
def test_reference_steps(problem, steps):
    assert problem.steps == steps
    assert problem.solution == "\n\n".join(steps)
    assert problem.answer == str(eval(f"{problem.a}{problem.op}{problem.b}"))


def test_prompt_round_trip_through_chat_text():
    p = Problem(457, "*", 38)
    assert p.prompt == "What is 457*38?"
    assert Problem.from_prompt(f"<s><|user|>{p.prompt}<|assistant|>") == p
    with pytest.raises(ValueError, match="no 'What is"):
        Problem.from_prompt("What is love?")


@pytest.mark.parametrize(
    "fault, answer",
    [
        # column 0 written as 14 instead of 13: 7+6+0=14 -> 844
        (Fault(0, "digit", 1), "844"),
        # carry out of column 1 dropped: 4+3+0=7 -> 743
        (Fault(1, "carry"), "743"),
    ],
)
def test_fault_is_carried_forward(fault, answer):
    steps = solve(Problem(457, "+", 386), fault)
    assert steps[-1] == f"\\boxed{{{answer}}}"


def test_fault_in_multiplication_sum():
    # running sum 3656+13710 written 1 too low -> 17365
    steps = solve(Problem(457, "*", 38), Fault(2, "digit", -1))
    assert steps[2:] == ("3656+13710=17365", "\\boxed{17365}")


def test_fault_that_does_not_fit_is_rejected():
    with pytest.raises(ValueError, match="does not fit"):
        solve(Problem(457, "+", 386), Fault(2, "carry"))  # the last column has no next column
    with pytest.raises(ValueError, match="does not fit"):
        solve(Problem(457, "*", 38), Fault(0, "carry"))
    with pytest.raises(ValueError, match="bad fault"):
        Fault(0, "typo")


@given(
    a=st.integers(0, 99999), b=st.integers(0, 99999), op=st.sampled_from("+-*"), seed=st.integers(0, 10**6)
)
def test_every_fault_changes_the_answer(a, b, op, seed):
    if op == "-" and a < b:
        a, b = b, a
    p = Problem(a, op, b)
    fault = random_fault(p, random.Random(seed))
    faulty = solve(p, fault)
    assert faulty[-1] != p.steps[-1]
    assert len(faulty) == len(p.steps)


def test_splits_are_deterministic_and_disjoint():
    train, held_out = make_splits(2000, 200, seed=3)
    assert (train, held_out) == make_splits(2000, 200, seed=3)
    assert len(set(train)) == 2000 and len(set(held_out)) == 200
    assert not set(train) & set(held_out)
    # Membership is a property of the problem: no other seed's train set meets this eval set either.
    assert not set(sample_problems(2000, split="train", seed=4)) & set(held_out)
    assert make_splits(50, 5, seed=4) != make_splits(50, 5, seed=3)


def test_config_controls_difficulty_and_solution_length():
    config = ArithmeticConfig(ops=("*",), min_digits=2, max_digits=3, mul_max_digits=2)
    problems = sample_problems(300, split="train", seed=0, config=config)
    assert {p.op for p in problems} == {"*"}
    assert all(10 <= p.a <= 999 and 10 <= p.b <= 99 for p in problems)
    easy = sample_problems(300, split="train", seed=0, config=ArithmeticConfig(ops=("+", "-"), max_digits=3))
    assert max(len(p.solution) for p in easy) < 200
    assert max(len(p.solution) for p in problems) < 200


def test_too_small_problem_space_is_an_error():
    tiny = ArithmeticConfig(ops=("+",), min_digits=1, max_digits=1)  # 100 problems, ~10 held out
    with pytest.raises(ValueError, match="distinct eval problems"):
        sample_problems(60, split="eval", seed=0, config=tiny)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ops": ("/",)},
        {"ops": ()},
        {"min_digits": 0},
        {"min_digits": 3, "max_digits": 2},
        {"eval_fraction": 1.0},
    ],
)
def test_bad_config(kwargs):
    with pytest.raises(ValueError):
        ArithmeticConfig(**kwargs)
