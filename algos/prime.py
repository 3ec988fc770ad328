"""PRIME: implicit process rewards (online PRM) + RLOO over process and outcome rewards, PPO clip.

ALGORITHMS.md "PRIME"; REFERENCE_NOTES §2, §7.1–7.6. The PRM side (implicit reward, λ smoothing,
normalisation, PRM losses, dpo_acc) is in `algos.prime_prm`; this module holds the group filter, the
oversample-then-downsample choice, the advantage and the spec.

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
from algos.masked import masked_mean, whiten
from algos.overlong import shaped_rewards
from algos.policy_gradient import STANDARD_LOSSES, kl_requirements
from algos.prime_prm import (
    dpo_abs_accuracy,
    dpo_accuracy,
    implicit_process_reward,
    normalize_process_reward,
    prm_ce_loss,
    process_reward_scale,
)
from algos.registry import PROX, AlgoSpec, StepBatch, register
from algos.returns import discounted_returns, place_at_last_token

PROCESS_BASELINES = ("seed", "reference")


def accuracy_group_filter(
    acc: torch.Tensor,
    group_index: torch.Tensor,
    lo: float = 0.2,
    hi: float = 0.8,
    *,
    filter_accuracy: bool = True,
    response_mask: torch.Tensor | None = None,
    max_response_length: int | None = None,
) -> torch.Tensor:
    """Rows to keep [B] bool; whole groups are kept or dropped.

    A group is kept iff lo ≤ mean_g(acc) ≤ hi (inclusive, mean in float64; skipped when
    `filter_accuracy=False`) and, when `max_response_length` is given (PRIME-orig `filter_truncated`),
    no row of the group has valid length Σ_t response_mask ≥ max_response_length.

    Deviations from the reference: PRIME-orig keeps sampling until the batch is full and buffers surplus
    prompts; that policy belongs to the buffer — this function only decides which groups pass.
    """
    if acc.dim() != 1 or group_index.shape != acc.shape:
        raise ValueError("acc and group_index must both be [B]")
    keep = torch.ones_like(acc, dtype=torch.bool)
    if acc.numel() == 0:
        return keep
    g = int(group_index.max()) + 1
    if filter_accuracy:
        count = baselines.group_sum(torch.ones_like(acc, dtype=torch.float64), group_index, g)
        mean = baselines.group_sum(acc.double(), group_index, g) / count.clamp_min(1.0)
        keep &= ((mean >= lo) & (mean <= hi))[group_index]
    if max_response_length is not None:
        if response_mask is None:
            raise ValueError("the truncation filter needs response_mask")
        truncated = (response_mask.sum(-1) >= max_response_length).double()
        keep &= (baselines.group_sum(truncated, group_index, g) == 0)[group_index]
    return keep


def downsample_groups(group_pass: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Indices [num_groups] int64 of the groups to train on, passing groups first (mirrors PRIME-verl
    `filter_and_downsample`, REFERENCE_NOTES §2.1 step 3 and §7.6).

    group_pass [G] bool: group g passes the filters, e.g. `accuracy_group_filter(...)` at g's first row
    (PRIME-verl's truncation filter, max valid length ≥ max_response_length − 1, is
    `max_response_length=L − 1` there). With G = oversample_factor × B candidates and num_groups = B the
    result is: every passing group in index order, then failing groups in index order, cut to exactly
    num_groups — so failing groups fill the batch when fewer than B pass. Row indices of group g with
    contiguous groups of n: g·n … g·n + n − 1 (the reference reorders rows that way).

    Deviations from the reference: the order is stable (the reference's `argsort(mask, descending=True)`
    does not guarantee which passing/failing groups come first among equals). In this system the
    function is not wired in: the buffer applies the accuracy filter (`buffer.filter=accuracy_window`)
    and the learner pulls `learner.batch_prompts` passing groups, so the refill happens by construction
    (the buffer waits for more passing groups; failing groups never fill a batch).
    """
    if group_pass.dim() != 1:
        raise ValueError(f"group_pass must be [G] (got shape {tuple(group_pass.shape)})")
    g = group_pass.shape[0]
    if not 0 <= num_groups <= g:
        raise ValueError(f"cannot keep {num_groups} groups out of {g} candidates")
    passing = group_pass.bool()
    order = torch.cat([torch.nonzero(passing).flatten(), torch.nonzero(~passing).flatten()])
    return order[:num_groups]


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


def prime_requirements(cfg: Any) -> frozenset[str]:
    """StepBatch inputs of spec "prime": the implicit-PRM provider's q, plus ref log-probs for a KL loss
    (and π_prox before the update when it is the PRM's reference, prime.ref = policy)."""
    prox = {PROX} if cfg.prime.ref == "policy" else set()
    return frozenset({"prime_q"} | prox) | kl_requirements(cfg)


def prime_problems(cfg: Any):
    """PRIME's configuration rules (RunConfig.problems)."""
    if cfg.buffer.filter != "accuracy_window":
        yield ("buffer.filter: PRIME trains on groups inside the accuracy window — set "
               "buffer.filter=accuracy_window (bounds buffer.acc_lo/acc_hi)")
    r = cfg.rollout
    if cfg.prime.ref == "policy" and (r.top_p < 1 or r.top_k > 0):
        yield ("prime.ref: 'policy' compares the PRM's untruncated log-probs with π_prox, which top-p/top-k "
               "truncate (rollout.top_p < 1 or rollout.top_k > 0) — use prime.ref=freeze or sample without "
               "truncation")
    if cfg.prime.drop_last_token and cfg.prime.granularity == "whole":
        yield ("prime.drop_last_token: with prime.granularity=whole the whole reward sits on the last token and "
               "would be dropped — set prime.granularity=token or prime.drop_last_token=false")


register(AlgoSpec(
    name="prime",
    summary="PRIME: implicit PRM process rewards + RLOO on process and outcome rewards, PPO clip",
    advantage=_prime_adv,
    losses=STANDARD_LOSSES,
    requires=prime_requirements,
    validate=prime_problems,
))
