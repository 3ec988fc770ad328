"""GRPO and RLOO: outcome reward, group baseline broadcast over the response, PPO clip loss.

Reads `cfg.grpo.use_std` (False = Dr.GRPO) and `cfg.grpo.eps`; RLOO has no options of its own. Both use
the standard losses of `algos.policy_gradient` (PPO clip × importance correction, optional entropy
and KL-to-reference terms).
"""

from __future__ import annotations

from typing import Any

import torch

from algos import baselines
from algos.policy_gradient import STANDARD_LOSSES, kl_requirements
from algos.registry import AlgoSpec, StepBatch, register


def outcome_advantage(estimator: str, batch: StepBatch, **kwargs) -> torch.Tensor:
    """Group baseline of the verifiable reward, broadcast over each row's response tokens: [B, T]."""
    adv = baselines.compute_baseline(estimator, batch.rewards.float(), batch.group_index, **kwargs)
    return adv[:, None] * batch.response_mask


def _grpo_adv(batch: StepBatch, cfg: Any):
    return outcome_advantage("grpo", batch, use_std=cfg.grpo.use_std, eps=cfg.grpo.eps), {}


def _rloo_adv(batch: StepBatch, cfg: Any):
    return outcome_advantage("rloo", batch), {}


register(AlgoSpec(
    name="grpo",
    summary="GRPO: group-normalised outcome reward, PPO clip (Dr.GRPO with grpo.use_std=false)",
    advantage=_grpo_adv,
    losses=STANDARD_LOSSES,
    requires=kl_requirements,
))

register(AlgoSpec(
    name="rloo",
    summary="RLOO: leave-one-out baseline on the outcome reward, PPO clip",
    advantage=_rloo_adv,
    losses=STANDARD_LOSSES,
    requires=kl_requirements,
))
