"""GRPO and RLOO: outcome reward, group baseline broadcast over the response, PPO clip loss (options and
registration: `algos.grpo.options`).

Reads `cfg.grpo.use_std` (False = Dr.GRPO) and `cfg.grpo.eps`; RLOO has no options of its own. Both use
the standard losses of `algos.policy_gradient` (PPO clip × importance correction, optional entropy
and KL-to-reference terms).
"""

from __future__ import annotations

from typing import Any

from algos import baselines
from algos.batch import StepBatch
from algos.overlong import shaped_rewards
from algos.policy_gradient import STANDARD_LOSSES
from algos.spec import Maths


def outcome_advantage(estimator: str, batch: StepBatch, cfg: Any, **kwargs):
    """Group baseline of the verifiable reward (plus DAPO's soft overlong punishment when configured,
    `algos.overlong.shaped_rewards`), broadcast over each row's response tokens: ([B, T], metrics)."""
    rewards, metrics = shaped_rewards(batch, cfg)
    adv = baselines.compute_baseline(estimator, rewards, batch.group_index, **kwargs)
    return adv[:, None] * batch.response_mask, metrics


def _grpo_adv(batch: StepBatch, cfg: Any):
    return outcome_advantage("grpo", batch, cfg, use_std=cfg.grpo.use_std, eps=cfg.grpo.eps)


def _rloo_adv(batch: StepBatch, cfg: Any):
    return outcome_advantage("rloo", batch, cfg)


GRPO = Maths(losses=STANDARD_LOSSES, advantage=_grpo_adv)
RLOO = Maths(losses=STANDARD_LOSSES, advantage=_rloo_adv)
