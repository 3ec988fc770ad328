"""The teacher provider of `--algo opd` on a real learner (world of one rank, tiny models): the teacher's
log-probs reach the advantage, a teacher equal to the policy gives no signal, and a missing one is named."""

import pytest

from learner.learner import Learner
from tests.learner.helpers import make_cfg, make_groups
from tests.learner.local_ranks import LearnerGroup


def test_teacher_equal_to_the_policy_gives_zero_reverse_kl(tiny_dir, tokenizer):
    # the teacher is the policy's own initial weights: log π_prox = log π_teacher on every token at step one,
    # so the reverse KL and the advantage are 0 and the policy gradient vanishes
    learner = Learner(make_cfg("opd", teacher={"path": str(tiny_dir)}), 0, 1, tiny_dir)
    m = learner.step(make_groups(tokenizer, 2, 4, version=0), version=0)
    assert m["opd/reverse_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["opd/kl_adv"] == pytest.approx(0.0, abs=1e-6)
    assert m["optim/grad_norm"] == pytest.approx(0.0, abs=1e-5)


def test_another_teacher_gives_a_signal_that_shrinks(tiny_dir, teacher_dir, tokenizer):
    # a teacher with other weights: the sampled tokens' log-ratios are far from 0, and training on the same
    # batch a few times shrinks them (opd/kl_adv = token mean of |log π_student − log π_teacher| at λ = 1: the
    # student moves toward the teacher on these tokens, up where the teacher is higher, down where lower)
    # (0.224 → 0.116 in 6 steps at lr 3e-4 when written; at the helpers' 1e-3 it overshoots and wobbles)
    cfg = make_cfg("opd", teacher={"path": str(teacher_dir)}, learner={"lr": 3e-4})
    learner = Learner(cfg, 0, 1, tiny_dir)
    groups = make_groups(tokenizer, 2, 4, version=0)
    gaps = [learner.step(groups, version=v)["opd/kl_adv"] for v in range(6)]
    assert gaps[0] > 0.05
    assert gaps[-1] < 0.8 * gaps[0], gaps


def test_a_missing_teacher_is_named(tiny_dir):
    with pytest.raises(ValueError, match="teacher.path is not set"):
        Learner(make_cfg("opd"), 0, 1, tiny_dir)


@pytest.mark.slow
def test_the_teacher_sharded_over_two_ranks_scores_as_one_rank(tiny_dir, teacher_dir, tokenizer):
    # FSDP2 across 2 gloo processes: the teacher is sharded like the reference model, and its log-probs (hence
    # the reverse KL, the advantage, the loss) equal those of the one-rank learner's unsharded teacher
    cfg = make_cfg("opd", teacher={"path": str(teacher_dir)}, learner={"batch_prompts": 4})
    groups = make_groups(tokenizer, 4, 4, version=0)
    with LearnerGroup(cfg, 2, str(tiny_dir), timeout_s=300) as group:
        two = group.step(groups, version=0)
    one = Learner(cfg, 0, 1, tiny_dir).step(groups, version=0)
    for k in ("opd/reverse_kl", "opd/kl_adv", "loss/total", "optim/grad_norm"):
        assert two[k] == pytest.approx(one[k], rel=1e-5, abs=1e-7), k
    assert abs(one["opd/reverse_kl"]) > 1e-3
