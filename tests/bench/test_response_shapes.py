"""bench/evidence/response_shapes.py: the per-sample measurements (golden values from the step checker)."""

from bench.evidence.response_shapes import arm_of, shape


def test_a_sample_is_measured_step_by_step():
    # 12+34: reference work steps "2+4+0=6, 6", "1+3+0=4, 46". Steps: right, wrong (no carry written), no claim
    # (digits only), boxed wrong answer -> right 1, wrong 2 (the boxed 45 counts as a wrong step), no-claim 1
    sample = {"prompt": "What is 12+34?", "response": "2+4+0=6, 6\n\n1+3=4\n\n4433\n\n\\boxed{45}", "reward": 0.0,
              "finish_reason": "stop"}
    assert shape(sample) == {"boxed": 1.0, "truncated": 0.0, "right": 1.0, "wrong": 2.0, "no-claim": 1.0,
                             "correct": 0.0}
    cut = {"prompt": "What is 12+34?", "response": "4433", "reward": 0.0, "finish_reason": "length"}
    assert shape(cut) == {"boxed": 0.0, "truncated": 1.0, "right": 0.0, "wrong": 0.0, "no-claim": 1.0,
                          "correct": 0.0}


def test_runs_of_one_arm_pool_by_folder_name():
    from pathlib import Path

    assert arm_of(Path("x/pure-min-s2")) == "pure-min" and arm_of(Path("pure-sum-s10")) == "pure-sum"
