"""On-policy distillation (`--algo opd`): golden advantages with the arithmetic shown, the student term
(π_prox or μ), the reward mix, the importance-corrected loss on a stale row, requirements and rules."""

import math

import pytest
import torch

import algos
from algos.aggregation import LossNorm
from algos.batch import LossContext, StepBatch
from algos.opd.maths import opd_advantage, reverse_kl_advantage
from algos.spec import PROX, TEACHER
from configs.schema import RunConfig
from tests.vectors import assert_close

# Two rows of one group. Row 0: 3 response tokens; row 1: 2 tokens and one padded column (its values must
# not count). log π_prox (the student), log π_teacher, and μ (the sampler, 0.1 below π_prox on row 0):
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
PROX_LP = torch.tensor([[-0.5, -1.0, -0.2], [-2.0, -0.1, 0.0]])
TEACHER_LP = torch.tensor([[-0.7, -0.4, -0.2], [-1.0, -0.3, -9.0]])
BEHAV_LP = torch.tensor([[-0.6, -1.1, -0.3], [-2.0, -0.1, 0.0]])
# d = log π_prox − log π_teacher = row 0 (0.2, −0.6, 0.0), row 1 (−1.0, 0.2, pad 0)
D = torch.tensor([[0.2, -0.6, 0.0], [-1.0, 0.2, 0.0]])


def cfg_with(**opd) -> RunConfig:
    return RunConfig.model_validate({"algo": "opd", "opd": opd, "teacher": {"path": "/teacher"}})


def batch(rewards=(1.0, 0.0)) -> StepBatch:
    return StepBatch(response_mask=MASK, prefix_mask=torch.zeros_like(MASK, dtype=torch.bool),
                     group_index=torch.tensor([0, 0]), rewards=torch.tensor(rewards), old_logprobs=PROX_LP,
                     behav_logprobs=BEHAV_LP, extras={TEACHER: TEACHER_LP})


def test_golden_reverse_kl_advantage_per_token():
    # λ = 1, γ = 0: A = −d = row 0 (−0.2, 0.6, 0.0), row 1 (1.0, −0.2, 0); the pad column stays 0 although
    # its d would be 0 − (−9) = 9.
    adv, d = reverse_kl_advantage(PROX_LP, TEACHER_LP, MASK)
    assert_close(d, D)
    assert_close(adv, torch.tensor([[-0.2, 0.6, 0.0], [1.0, -0.2, 0.0]]))


def test_golden_discounted_reverse_kl_advantage():
    # λ = 2, γ = 0.5: a = −2d = row 0 (−0.4, 1.2, 0), row 1 (2.0, −0.4, 0); right to left:
    # row 0: t2 = 0; t1 = 1.2 + 0.5·0 = 1.2; t0 = −0.4 + 0.5·1.2 = 0.2
    # row 1: t2 = 0 (pad); t1 = −0.4; t0 = 2.0 + 0.5·(−0.4) = 1.8
    adv, _ = reverse_kl_advantage(PROX_LP, TEACHER_LP, MASK, kl_coef=2.0, discount=0.5)
    assert_close(adv, torch.tensor([[0.2, 1.2, 0.0], [1.8, -0.4, 0.0]]))


def test_golden_spec_advantage_and_metrics_distillation_alone():
    # defaults: λ = 1, student = prox, γ = 0, reward_coef = 0 → A = −d (first golden).
    # opd/reverse_kl = mean of d over the 5 tokens = (0.2 − 0.6 + 0 − 1.0 + 0.2)/5 = −1.2/5 = −0.24
    # opd/kl_adv = mean |A| = (0.2 + 0.6 + 0 + 1.0 + 0.2)/5 = 2.0/5 = 0.4; no reward term, no opd/reward_adv
    adv, m = opd_advantage(batch(), cfg_with())
    assert_close(adv, -D)
    assert float(m["opd/reverse_kl"]) == pytest.approx(-0.24)
    assert float(m["opd/kl_adv"]) == pytest.approx(0.4)
    assert "opd/reward_adv" not in m


def test_golden_student_term_behaviour():
    # opd.student = behaviour: d = μ − log π_teacher = row 0 (−0.6 + 0.7, −1.1 + 0.4, −0.3 + 0.2)
    # = (0.1, −0.7, −0.1), row 1 (−1.0, 0.2) as before → A = row 0 (−0.1, 0.7, 0.1), row 1 (1.0, −0.2, 0)
    adv, m = opd_advantage(batch(), cfg_with(student="behaviour"))
    assert_close(adv, torch.tensor([[-0.1, 0.7, 0.1], [1.0, -0.2, 0.0]]))
    # reverse_kl = (0.1 − 0.7 − 0.1 − 1.0 + 0.2)/5 = −1.5/5 = −0.3
    assert float(m["opd/reverse_kl"]) == pytest.approx(-0.3)


def test_golden_reward_mix_grpo_and_rloo():
    # rewards (1, 0) in one group. grpo: mean 0.5, unbiased std = √((0.5² + 0.5²)/1) = 0.7071068,
    # A^reward = ±0.5/(0.7071068 + 1e-6) = ±0.7071058; × c = 0.5 → ±0.3535529 on every response token:
    # row 0 = (−0.2, 0.6, 0.0) + 0.3535529 = (0.1535529, 0.9535529, 0.3535529)
    # row 1 = (1.0, −0.2) − 0.3535529 = (0.6464471, −0.5535529), pad 0
    # opd/reward_adv = mean |c·A^reward| over the 5 tokens = 0.3535529
    r = 0.5 * 0.5 / (math.sqrt(0.5) + 1e-6)
    adv, m = opd_advantage(batch(), cfg_with(reward_coef=0.5))
    assert_close(adv, torch.tensor([[-0.2 + r, 0.6 + r, r], [1.0 - r, -0.2 - r, 0.0]]))
    assert float(m["opd/reward_adv"]) == pytest.approx(r, rel=1e-6)
    # rloo: A^reward = 1 − 0 = 1 and 0 − 1 = −1; × c = 0.5 → ±0.5
    adv, _ = opd_advantage(batch(), cfg_with(reward_coef=0.5, reward_estimator="rloo"))
    assert_close(adv, torch.tensor([[0.3, 1.1, 0.5], [0.5, -0.7, 0.0]]))
    # kl_coef = 0: the reward term alone is GRPO's advantage × c
    adv, _ = opd_advantage(batch(), cfg_with(kl_coef=0.0, reward_coef=1.0, use_std=False))
    assert_close(adv, torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, 0.0]]))


def test_golden_loss_on_a_stale_row_is_importance_corrected():
    # One token, π_θ = π_prox = −0.5 (ratio 1, no PPO clip), μ = −1.0 (the row is stale), teacher −0.3.
    # student = prox: d = −0.5 + 0.3 = −0.2, A = 0.2; tis weight w = min(e^(−0.5 + 1.0), 2) = e^0.5 = 1.6487213;
    # ℓ = −A·r·w = −0.2 · 1 · 1.6487213 = −0.3297443 (token-mean over one token).
    # student = behaviour: d = −1.0 + 0.3 = −0.7, A = 0.7, ℓ = −0.7 · 1.6487213 = −1.1541049.
    spec = algos.get("opd")
    one = torch.ones(1, 1)
    for student, want in (("prox", -0.2 * math.exp(0.5)), ("behaviour", -0.7 * math.exp(0.5))):
        cfg = cfg_with(student=student)
        b = StepBatch(response_mask=one, prefix_mask=torch.zeros(1, 1, dtype=torch.bool),
                      group_index=torch.tensor([0]), rewards=torch.tensor([0.0]),
                      old_logprobs=torch.tensor([[-0.5]]), behav_logprobs=torch.tensor([[-1.0]]),
                      extras={TEACHER: torch.tensor([[-0.3]])})
        adv, _ = spec.advantage(b, cfg)
        lp = torch.tensor([[-0.5]], requires_grad=True)
        ctx = LossContext(logprobs=lp, entropy=None, batch=b, advantages=adv, norm=LossNorm.local(one))
        term = spec.losses[0].fn(ctx, cfg)
        assert float(term.loss.detach()) == pytest.approx(want, rel=1e-6), student
        assert float(term.metrics["is/weight_mean"]) == pytest.approx(math.exp(0.5), rel=1e-6)
        term.loss.backward()
        assert float(lp.grad) == pytest.approx(want, rel=1e-6)  # ∂(−A·e^(lp − prox)·w)/∂lp at lp = prox


def test_teacher_equal_to_student_gives_zero_advantage():
    b = batch()
    b.extras[TEACHER] = PROX_LP.clone()
    adv, m = opd_advantage(b, cfg_with())
    assert (adv == 0).all() and float(m["opd/reverse_kl"]) == 0.0


def test_requirements():
    spec = algos.get("opd")
    assert spec.requires(cfg_with()) == {TEACHER, PROX}
    assert spec.requires(cfg_with(student="behaviour")) == {TEACHER}  # no extra π_prox forward before the update
    cfg = cfg_with()
    cfg.loss.kl_coef = 0.1
    assert spec.requires(cfg) == {TEACHER, PROX, "ref_logprobs"}


def test_rules():
    # groups of one are fine for distillation alone, not with the reward term
    RunConfig.model_validate({"algo": "opd", "rollout": {"n": 1}})
    with pytest.raises(ValueError, match=r"rollout.n: the reward term \(opd.reward_coef=0.5\).*set rollout.n ≥ 2"):
        RunConfig.model_validate({"algo": "opd", "rollout": {"n": 1}, "opd": {"reward_coef": 0.5}})
    with pytest.raises(ValueError, match="opd.kl_coef: 0 with opd.reward_coef 0 leaves no advantage"):
        cfg_with(kl_coef=0.0)
    with pytest.raises(ValueError, match="Input should be 'prox' or 'behaviour'"):
        cfg_with(student="mu")
