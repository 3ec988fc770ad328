"""PRIME: implicit process rewards (online PRM) + RLOO over process and outcome rewards, PPO clip.

ALGORITHMS.md "PRIME"; REFERENCE_NOTES §2, §7.1–7.6. The PRM side (implicit reward, λ smoothing,
normalisation, PRM losses, dpo_acc) is in `algos.prime.prm`; options, rules and registration in
`algos.prime.options`; this module holds the advantage. The group filter is the buffer's
(`buffer.filter=accuracy_window`); the reference's filter and downsampling are test oracles
(`tests/reference/prime.py`).

Spec "prime" reads `cfg.prime`: beta, raw_q, lam, use_gt, granularity, drop_last_token, norm,
norm_shards, c_gt, c_pr, gamma, outcome_gamma, whiten, process_baseline. `update`, `ref`, `prm_loss`,
`prm_lr`, `prm_grad_clip` belong to the learner's PRM provider. Inputs: `batch.extras["prime_q"]` [B, T]
float (q = log π_φ − log π_ref per response token, from the provider) and `batch.rewards` [B] (verifier
accuracy v_i; also the acc of `prime.use_gt`).
"""

from __future__ import annotations

from typing import Any

import torch

from algos import baselines
from algos.batch import StepBatch
from algos.masked import masked_mean, whiten
from algos.overlong import shaped_rewards
from algos.policy_gradient import STANDARD_LOSSES
from algos.prime.options import PROCESS_BASELINES
from algos.prime.prm import (
    dpo_abs_accuracy,
    dpo_accuracy,
    implicit_process_reward,
    normalize_process_reward,
    prm_ce_loss,
    process_reward_scale,
)
from algos.returns import discounted_returns, place_at_last_token
from algos.spec import Maths


def rloo_process_rewards(r: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                         mode: str = "seed") -> torch.Tensor:
    """Process rewards minus their group baseline: [B, T] -> [B, T] (0 outside the mask).

    With m_j = Σ_u r_{j,u} M_{j,u} / |y_j| (an empty row has m_j = 0) and n the group size:
      seed       r_{i,t} − mean_{j≠i} m_j                      (true leave-one-out, the default)
      reference  (n·r_{i,t} − Σ_{j∈g} m_j)/(n − 1) = r_{i,t} − (Σ_j m_j − r_{i,t})/(n − 1)
                 (the reference code's baseline, REFERENCE_NOTES §2.5 / §7.1; not leave-one-out)
    Singleton groups: the rewards are returned unchanged (baseline 0).

    Deviations from the reference: a singleton group divides by zero there; an empty row gives a NaN
    mean there and 0 here.
    """
    if mode not in PROCESS_BASELINES:
        raise ValueError(f"unknown prime.process_baseline {mode!r}; choose one of {PROCESS_BASELINES}")
    m = mask.to(r.dtype)
    if r.shape[0] == 0:
        return r * m
    x = r * m
    row_mean = masked_mean(x, m, dim=-1)
    g = int(group_index.max()) + 1
    n = baselines.group_sum(torch.ones_like(row_mean), group_index, g)[group_index]
    total = baselines.group_sum(row_mean, group_index, g)[group_index]
    denom = (n - 1.0).clamp_min(1.0)[:, None]
    if mode == "seed":
        out = x - ((total - row_mean)[:, None] / denom)
    else:
        out = x - (total[:, None] - x) / denom
    return torch.where((n > 1)[:, None], out, x) * m


def prime_advantage(
    r: torch.Tensor,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    *,
    c_gt: float = 5.0,
    c_pr: float = 5.0,
    gamma: float = 1.0,
    outcome_gamma: float = 1.0,
    do_whiten: bool = True,
    process_baseline: str = "seed",
) -> tuple[torch.Tensor, torch.Tensor]:
    """PRIME advantages and returns from (normalised) process rewards r [B, T] and outcomes v [B].

    returns_{i,t} = c_gt·γ_o^{e_i−t}·(v_i − mean_{j≠i} v_j)
                  + c_pr·Σ_{s≥t} γ^{s−t} M_{i,s}·[r_{i,s} − b_{i,s}]       (b from `rloo_process_rewards`)
    i.e. the outcome RLOO sits at the last response token e_i and its discounted return (γ_o =
    outcome_gamma, default 1: the seed formula's undiscounted broadcast) is added at every t ≤ e_i.
    advantages = whiten(returns, M) over the whole batch when `do_whiten` (Bessel; needs ≥ 2 tokens,
    else ValueError), else returns. Returns (advantages, returns), both [B, T].

    As the reference, whitening does not re-zero padding positions (the loss masks them); the returns
    are 0 on right padding. Singleton groups: both baselines are 0. Empty rows: returns 0.

    Deviations from the reference: PRIME-orig ignores c_gt/c_pr (use c_gt = c_pr = 1, equivalent under
    whitening); PRIME-verl has no γ (use γ = 1). The process baseline is leave-one-out by default;
    `process_baseline="reference"` reproduces both reference implementations.
    """
    m = mask.to(r.dtype)
    x = rloo_process_rewards(r, m, group_index, process_baseline)
    out_adv = baselines.rloo(rewards.to(r.dtype), group_index)
    returns = (c_pr * discounted_returns(x, m, gamma)
               + c_gt * discounted_returns(place_at_last_token(out_adv, m), m, outcome_gamma))
    adv = whiten(returns, m) if do_whiten else returns
    return adv, returns


def _check_q(batch: StepBatch) -> torch.Tensor:
    q = batch.extras.get("prime_q")
    if q is None:
        raise ValueError("PRIME needs batch.extras['prime_q'] ([B, T] implicit-PRM q from the provider)")
    if q.shape != batch.response_mask.shape:
        raise ValueError(f"prime_q has shape {tuple(q.shape)}, expected {tuple(batch.response_mask.shape)}")
    if not torch.isfinite(q * batch.response_mask).all():
        raise ValueError("prime_q holds non-finite values on response tokens")
    return q.float()


def _prime_adv(batch: StepBatch, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    pc = cfg.prime
    m = batch.response_mask.float()
    q = _check_q(batch)
    acc = batch.rewards.float()
    r = implicit_process_reward(q, m, pc.beta, pc.raw_q, pc.granularity, lam=pc.lam, use_gt=pc.use_gt, acc=acc,
                                drop_last_token=pc.drop_last_token)
    shards = pc.norm_shards
    scale = process_reward_scale(r, m, pc.norm, shards)
    r = normalize_process_reward(r, m, pc.norm, shards)
    outcome, overlong_metrics = shaped_rewards(batch, cfg)  # the PRM's label and dpo_acc keep raw accuracy
    adv, returns = prime_advantage(
        r, m, outcome, batch.group_index,
        c_gt=pc.c_gt, c_pr=pc.c_pr, gamma=pc.gamma, outcome_gamma=pc.outcome_gamma,
        do_whiten=pc.whiten, process_baseline=pc.process_baseline,
    )
    metrics = {
        "prime/q_mean": masked_mean(q, m),
        "prime/reward_mean": masked_mean(r, m),
        "prime/seq_reward_mean": r.sum(-1).mean() if r.shape[0] else torch.zeros(()),
        "prime/norm_scale": scale.mean() if scale.numel() else torch.zeros(()),
        "prime/prm_ce_eval": prm_ce_loss(q, acc.clamp(0.0, 1.0), m, pc.beta),
        "prime/dpo_acc": dpo_accuracy(q, acc, m, batch.group_index),
        "prime/dpo_abs_acc": dpo_abs_accuracy(q, acc, m),
        "prime/return_mean": masked_mean(returns, m),
        "prime/adv_mean": masked_mean(adv, m),
    }
    return adv * m, {k: v.detach() for k, v in (metrics | overlong_metrics).items()}


MATHS = Maths(losses=STANDARD_LOSSES, advantage=_prime_adv)
