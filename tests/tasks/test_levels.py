"""Difficulty levels of the synthetic task (the step-by-step testbed's steps-main and steps-hard)."""

import pytest

from tasks.arithmetic import LEVELS, Fault, Problem, level_config, make_splits, solve
from tasks.step_checker import score_steps, split_steps


@pytest.mark.parametrize("level, digits, steps, longest", [
    # + and − write one step per column of the longer operand, then the box: 4-5 digits -> 5-6 steps.
    # Longest steps-main solution: column k's step is an 8-character equation ("9+9+1=19"), ", " and the k digits
    # written so far (the last column writes its whole sum: 6): 11 + 12 + 13 + 14 + 16 = 66, plus 5 separators
    # of 2 and the box "\boxed{199998}" of 14 = 90 (so rollout.max_response_tokens 256 leaves room to pad)
    ("steps-main", (4, 5), (5, 6), 91),
    # 8 columns: 8-9 steps; (11 + ... + 17) + 19 = 117, 8 separators (16) and a box of 17 = 150
    ("steps-hard", (7, 8), (8, 9), 151),
])
def test_levels_have_the_digits_steps_and_lengths_they_promise(level, digits, steps, longest):
    train, held_out = make_splits(500, 100, seed=0, config=level_config(level))
    for p in train + held_out:
        assert p.op in ("+", "-")
        assert digits[0] <= len(str(max(p.a, p.b))) <= digits[1]
        assert steps[0] <= len(p.steps) <= steps[1]
        assert len(p.solution) < longest
    # both step counts occur (operands of either digit count are drawn)
    assert {len(p.steps) for p in train} == set(range(steps[0], steps[1] + 1))


def test_levels_are_deterministic_in_the_seed_and_their_splits_disjoint():
    cfg = level_config("steps-main")
    a_train, a_eval = make_splits(200, 50, seed=3, config=cfg)
    b_train, b_eval = make_splits(200, 50, seed=3, config=cfg)
    c_train, _ = make_splits(200, 50, seed=4, config=cfg)
    assert (a_train, a_eval) == (b_train, b_eval)
    assert a_train != c_train
    assert not set(a_train) & set(a_eval) and not set(c_train) & set(a_eval)


def test_the_hard_level_shares_no_problem_with_the_main_level():
    main, _ = make_splits(300, 10, seed=0, config=LEVELS["steps-main"])
    hard, _ = make_splits(300, 10, seed=0, config=LEVELS["steps-hard"])
    assert not set(main) & set(hard)


def test_an_unknown_level_names_the_levels():
    with pytest.raises(ValueError, match="unknown arithmetic level 'steps-medium'; choose one of steps-main, steps-hard"):
        level_config("steps-medium")


def test_the_step_checker_labels_each_step_of_a_main_level_solution():
    p = Problem(48157, "+", 9236)  # columns: 7+6+0=13 | 5+3+1=9 | 1+2+0=3 | 8+9+0=17 | 4+0+1=5
    assert p.steps == ("7+6+0=13, 3", "5+3+1=9, 93", "1+2+0=3, 393", "8+9+0=17, 7393", "4+0+1=5, 57393",
                       "\\boxed{57393}")
    right = score_steps(p, p.solution, split_steps(p.solution))
    assert right == [1.0] * 6
    # a wrong digit in column 2 (1+2+0=4): that step and every later one that carries the 4 are wrong
    slipped = "\n\n".join(solve(p, Fault(2, "digit", 1)))
    assert slipped.split("\n\n")[2] == "1+2+0=4, 493"
    assert score_steps(p, slipped, split_steps(slipped)) == [1.0, 1.0, -1.0, -1.0, -1.0, -1.0]
    # a dropped carry out of column 0 (13 carries 1): column 1 then adds 0, and the slip travels on
    dropped = "\n\n".join(solve(p, Fault(0, "carry")))
    assert score_steps(p, dropped, split_steps(dropped)) == [1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
