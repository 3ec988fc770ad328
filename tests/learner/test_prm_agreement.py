"""learner.prm.agreement: the learned PRM's agreement with the step checker and the verifier (golden values)."""

import pytest

from learner.prm.agreement import (
    mixed_rows,
    pair_accuracy,
    prm_agreement,
    step_agreement,
    step_agreement_by_class,
)


def test_step_agreement_counts_only_steps_both_judge():
    # row 0: (0.4, +1) agree, (-0.2, -1) agree, (0.9, 0) no claim: skipped; row 1: (None, +1) skipped,
    # (0.0, +1) disagrees (p = 0 is not > 0), (-0.5, +1) disagrees  ->  2 agree of 4 judged = 0.5
    prm = [[0.4, -0.2, 0.9], [None, 0.0, -0.5]]
    checker = [[1.0, -1.0, 0.0], [1.0, 1.0, 1.0]]
    assert step_agreement(prm, checker) == 0.5
    assert step_agreement([[0.3]], [[0.0]]) is None


def test_step_agreement_per_class():
    # the rows above: checker +1 steps (0.4 agree, 0.0 and -0.5 disagree) -> 1/3; its -1 step (-0.2) -> 1/1.
    # A PRM that calls everything right scores 1.0 on right steps and 0.0 on wrong ones, whatever their mix
    prm = [[0.4, -0.2, 0.9], [None, 0.0, -0.5]]
    checker = [[1.0, -1.0, 0.0], [1.0, 1.0, 1.0]]
    assert step_agreement_by_class(prm, checker) == (pytest.approx(1 / 3), 1.0)
    assert step_agreement_by_class([[0.9, 0.9, 0.9]], [[1.0, -1.0, -1.0]]) == (1.0, 0.0)
    assert step_agreement_by_class([[0.9]], [[1.0]]) == (1.0, None)  # no wrong step


def test_pair_accuracy_is_dpo_acc_of_the_min_verdict():
    # group 7: verdicts min = 0.5, -0.8, 0.1; outcomes 1, 0, 0:
    # pairs (0,1): 0.5 > -0.8 and 1 > 0 agree; (0,2): 0.5 > 0.1 agree; (1,2): equal outcomes, weight 0 -> 1.0.
    # group 3: verdicts -0.3 (right answer) and 0.0 (row 4: no scored step) with outcomes 1, 0: ordered wrongly -> 0.0.
    # group 5: both outcomes 0: no pair differs -> 0.5.  Mean over groups = (1.0 + 0.0 + 0.5) / 3 = 0.5
    prm = [[0.9, 0.5], [-0.8, 0.2], [0.1], [-0.3, 0.4], [None], [0.2], [0.3]]
    outcomes = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    groups = [7, 7, 7, 3, 3, 5, 5]
    assert pair_accuracy(prm, outcomes, groups) == pytest.approx(0.5)
    # on the mixed groups only (7 and 3; group 5's 0.5 left out): (1.0 + 0.0) / 2
    assert mixed_rows(outcomes, groups) == [0, 1, 2, 3, 4]
    got = prm_agreement([("p", "r", [])] * 7, prm, outcomes, groups, against_checker=False)
    assert got == {"pure/prm_pair_acc": pytest.approx(0.5), "pure/prm_pair_acc_mixed": pytest.approx(0.5)}
    groups_b = [7, 7, 7, 5, 5, 5, 5]  # rows 3-6 in one group: outcomes 1, 0, 0, 0, verdicts -0.3, 0, 0.2, 0.3:
    # the right answer below all three wrong ones -> 0.0; group 7 -> 1.0; both mixed: (1.0 + 0.0) / 2
    assert prm_agreement([("p", "r", [])] * 7, prm, outcomes, groups_b, False)["pure/prm_pair_acc_mixed"] == 0.5
    assert "pure/prm_pair_acc_mixed" not in prm_agreement([("p", "r", [])], [[0.3]], [0.0], [1], False)


def test_prm_agreement_reads_the_checker_only_for_arithmetic_prompts():
    # the reference's work steps are "2+4+0=6, 6" and "1+3+0=4, 46": the checker says +1, -1 (no carry
    # written), +1 (the boxed answer); the PRM's 0.5, 0.5, -0.5 agree on the first step only -> 1/3
    prompt = "What is 12+34?"
    response = "2+4+0=6, 6\n\n1+3=4\n\n\\boxed{46}"
    spans = [(0, 12), (12, 19), (19, len(response))]
    items = [(prompt, response, spans)]
    got = prm_agreement(items, [[0.5, 0.5, -0.5]], [1.0], [0], against_checker=True)
    assert got["pure/prm_step_acc"] == pytest.approx(1 / 3)
    assert got["pure/prm_pair_acc"] == 0.5
    # per class: the right steps 1 and 3 (0.5 agrees, -0.5 does not) -> 0.5; the wrong step 2 (0.5) -> 0.0
    assert (got["pure/prm_step_acc_correct"], got["pure/prm_step_acc_wrong"]) == (0.5, 0.0)
    other = [("Prove that x is even.", response, spans)]
    assert "pure/prm_step_acc" not in prm_agreement(other, [[0.5, -0.5, 0.5]], [1.0], [0], against_checker=True)
    assert "pure/prm_step_acc" not in prm_agreement(items, [[1.0, 1.0, 1.0]], [1.0], [0], against_checker=False)
