"""On-policy distillation: the advantage of every sampled token is the negative per-token reverse KL to a frozen
teacher, optionally plus a share of the verifiable reward's group advantage; the loss is the shared PPO clip
× behaviour importance correction (`algos.policy_gradient`), so stale rows are corrected like every
algorithm's (options and registration: `algos.opd.options`).

Reads `cfg.opd`: kl_coef λ, student, discount γ, reward_coef c, reward_estimator, use_std. Inputs:
`batch.extras["teacher_logprobs"]` [B, T] (log π_teacher of each response token, from the learner's
teacher provider), `batch.old_logprobs` (π_prox, opd.student=prox) or `batch.behav_logprobs` (μ,
opd.student=behaviour), `batch.rewards` [B].

With d_t = log π_student(y_t) − log π_teacher(y_t) on on-policy response tokens M (y_t the student's own
sample; E_{y∼π_student}[d_t] is the reverse KL KL(π_student ‖ π_teacher) at that position):
  A_t = −λ·d_t                                 (γ = 0)
  A_t = Σ_{k≥t} γ^{k−t}·(−λ·d_k)·M_k           (γ > 0)
  A_t += c·A_i^reward·M_t                     (c > 0: grpo or rloo baseline over the group, DAPO's overlong
                                               shaping applied to the reward first, `algos.overlong`)
The teacher is frozen, so a stale row's target is exact; only the student term ages, which opd.student=prox
avoids (it is recomputed at the step, and the importance weight π_prox/μ corrects the sampling).
No reference implementation clips d_t and neither does this one: the PPO clip bounds each step.

Metrics (docs/metrics.md): opd/reverse_kl (token mean of d over the step: the k1 estimate of the reverse KL
per token), opd/kl_adv and opd/reward_adv (token means of |the two terms of A|, after their coefficients).
"""

from __future__ import annotations

from typing import Any

import torch

from algos import baselines
from algos.batch import StepBatch
from algos.masked import masked_mean
from algos.overlong import shaped_rewards
from algos.policy_gradient import STANDARD_LOSSES
from algos.returns import discounted_returns
from algos.spec import TEACHER, Maths


def reverse_kl_advantage(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, kl_coef: float = 1.0,
                         discount: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [B, T], d [B, T]): d = (log π_student − log π_teacher)·M and A = −λ·d, discounted over the future
    tokens of its row when γ > 0 (module docstring). 0 outside the mask."""
    m = mask.to(student.dtype)
    d = (student - teacher) * m
    adv = -kl_coef * d
    if discount > 0:
        adv = discounted_returns(adv, m, discount)
    return adv * m, d


def opd_advantage(batch: StepBatch, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The advantage of spec "opd" (module docstring) and its metrics."""
    oc = cfg.opd
    if TEACHER not in batch.extras:
        raise ValueError("opd needs the teacher's log-probs (extras['teacher_logprobs']), but the learner provided "
                         "none")
    student = batch.old_logprobs if oc.student == "prox" else batch.behav_logprobs
    if student is None:
        raise ValueError("opd.student=prox needs π_prox before the update, but the batch has none")
    m = batch.on_policy_mask
    kl_adv, d = reverse_kl_advantage(student, batch.extras[TEACHER], m, oc.kl_coef, oc.discount)
    adv = kl_adv
    metrics = {"opd/reverse_kl": masked_mean(d, m), "opd/kl_adv": masked_mean(kl_adv.abs(), m)}
    if oc.reward_coef > 0:
        rewards, metrics_r = shaped_rewards(batch, cfg)
        kwargs = {"use_std": oc.use_std} if oc.reward_estimator == "grpo" else {}
        row = baselines.compute_baseline(oc.reward_estimator, rewards, batch.group_index, **kwargs)
        reward_adv = oc.reward_coef * row[:, None] * m
        adv = adv + reward_adv
        metrics |= metrics_r | {"opd/reward_adv": masked_mean(reward_adv.abs(), m)}
    return adv, metrics


MATHS = Maths(losses=STANDARD_LOSSES, advantage=opd_advantage)
