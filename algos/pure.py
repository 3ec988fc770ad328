"""PURE: min-form credit assignment of PRM step scores, fused with RLOO on the verifiable reward.

ALGORITHMS.md "PURE"; REFERENCE_NOTES §3, §7.7–7.10. Step splitting, the min-form transform and the
credit assignment are in `algos.pure_steps`; this module holds the baselines, the fusion and the spec.

Spec "pure" reads `cfg.pure`: credit, temperature, gamma, c_pr, c_vr, baseline, whiten,
zero_separators, zero_final, kl_coef. Inputs from the learner's "process_rewards" provider:
`batch.extras["step_end_mask"]` [B, T] bool (every step's last token, the final response token included)
and `batch.extras["step_scores"]` [B, T] float (p_k at step ends, 0 elsewhere); `batch.rewards` [B].
With `pure.kl_coef > 0` the per-token KL-in-reward is k1 = (log π_prox − log π_ref)·M from the batch's
`old_logprobs` and `ref_logprobs`, summed undiscounted from t to the end.

Deviations from the reference: PURE-main takes the KL with the rollout actor's log-probs; here π_prox
(the learner's recomputed log-probs, the same numerics as the reference model) stands in for them.
Group filters (PURE's optional all-0/all-1 curriculum filter) belong to the buffer.
"""

from __future__ import annotations

from typing import Any

import torch

from algos import baselines
from algos.masked import masked_mean, whiten
from algos.policy_gradient import STANDARD_LOSSES, kl_requirements
from algos.pure_steps import process_returns
from algos.registry import AlgoSpec, StepBatch, register
from algos.returns import last_token_index, suffix_sum

BASELINES = ("token", "step")


def check_step_ends(step_end: torch.Tensor, mask: torch.Tensor) -> None:
    """ValueError unless step_end [B, T] lies inside the mask and ends every non-empty row's final token."""
    if step_end.shape != mask.shape:
        raise ValueError(f"step_end_mask has shape {tuple(step_end.shape)}, expected {tuple(mask.shape)}")
    ends, m = step_end.bool(), mask.bool()
    if (ends & ~m).any():
        raise ValueError("step_end_mask marks tokens outside the response mask")
    last = last_token_index(m)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    missing = rows[~ends[rows, last[rows]]]
    if missing.numel():
        raise ValueError(f"rows {missing[:5].tolist()} do not end a step at their final response token; "
                         "the final token is always a step end (algos.pure_steps.split_steps)")


def _first_value(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x at each row's first response token ([B]); 0 for empty rows."""
    m = mask.bool()
    idx = m.to(torch.int64).argmax(-1, keepdim=True)
    return torch.where(m.any(-1), x.gather(-1, idx).squeeze(-1), torch.zeros_like(x[:, 0]))


def _loo_mean(num: torch.Tensor, den: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Σ_{j≠i} num_j / Σ_{j≠i} den_j within the group of i; 0 where the denominator is 0."""
    g = int(group_index.max()) + 1
    s_num = baselines.group_sum(num, group_index, g)[group_index] - num
    s_den = baselines.group_sum(den, group_index, g)[group_index] - den
    return torch.where(s_den > 0, s_num / s_den.clamp_min(1e-12), torch.zeros_like(s_num))


def process_baseline(
    returns: torch.Tensor,
    step_end: torch.Tensor,
    mask: torch.Tensor,
    group_index: torch.Tensor,
    mode: str = "token",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Baseline of the process return: (baseline_t [B, T], b_i [B]).

    O_j = process return at row j's first token (for min-form: Σ_k r_{j,k}); len_j = Σ_t M (separators
    and the final token counted); K_j = #steps; ntok_{j,k} = tokens of step k excluding its end token.
      token (PURE-main default): b_i = Σ_{j≠i} O_j / Σ_{j≠i} len_j, and b_i·ntok_{i,k} is subtracted at
            step k's end, so baseline_t = b_i · Σ_{k : e_k ≥ t} ntok_{i,k}.
      step:  b_i = mean_{j≠i, K_j>0} O_j / K_j, subtracted at every step end:
            baseline_t = b_i · #{k : e_k ≥ t}.
    Singleton groups, or groups whose other rows are empty, have b_i = 0. Padding holds 0.

    Deviations from the reference: PURE-verl's baseline (others' summed returns / ((n−1)·padded width))
    is not offered; a singleton group divides by zero there.
    """
    if mode not in BASELINES:
        raise ValueError(f"unknown pure.baseline {mode!r}; choose one of {BASELINES}")
    m = mask.to(returns.dtype)
    ends = (step_end.bool() & mask.bool()).to(returns.dtype)
    if returns.shape[0] == 0:
        return torch.zeros_like(returns), returns.new_zeros(0)
    total = _first_value(returns, m)
    if mode == "token":
        b = _loo_mean(total, m.sum(-1), group_index)
        nonend = torch.cumsum(m * (1.0 - ends), dim=-1)  # non-end tokens at positions ≤ t
        at_ends = nonend * ends
        before = torch.cummax(at_ends, dim=-1).values
        prev_end = torch.cat([torch.zeros_like(before[:, :1]), before[:, :-1]], dim=-1)
        ntok_at_end = (nonend - prev_end) * ends
        count = suffix_sum(ntok_at_end)
    else:
        k = ends.sum(-1)
        has = (k > 0).to(returns.dtype)
        b = _loo_mean(total / k.clamp_min(1.0) * has, has, group_index)
        count = suffix_sum(ends)
    return b[:, None] * count * m, b


def pure_advantage(
    step_scores: torch.Tensor,
    step_end: torch.Tensor,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    *,
    credit: str = "minform",
    temperature: float = 0.1,
    gamma: float = 1.0,
    c_pr: float = 1.0,
    c_vr: float = 1.0,
    baseline: str = "token",
    do_whiten: bool = False,
    zero_separators: bool = True,
    zero_final: bool = False,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PURE advantages [B, T] (0 outside the mask and at zeroed positions) and intermediate tensors.

    A_t = c_pr·(R_t − baseline_t) + c_vr·(v_i − mean_{j≠i} v_j) − kl_coef·Σ_{s≥t} kl_s, on every
    response token, with R from `pure_steps.process_returns` (credit, temperature, gamma), the
    baseline from `process_baseline`, the RLOO of `algos.baselines.rloo` (a singleton keeps v_i), and
    kl [B, T] the per-token k1 KL-in-reward term (optional). Then:
      zeroed = separators (step ends other than the final token; `zero_separators`, default on)
               ∪ final response token (`zero_final`, the PURE-main reference behaviour);
      `do_whiten`: whiten over the response tokens that are not zeroed (Bessel; < 2 such tokens is a
               ValueError); zeroed tokens get advantage 0.
    The info dict holds step_rewards, returns, baseline [B, T], b [B], total_process [B].

    Deviations from the reference: the VR reward scale ({−1, 0} in PURE-main, {0, 1} in PURE-verl) is
    irrelevant (RLOO is shift-invariant). PURE-main's buffer normaliser counts zeroed tokens in the
    variance numerator but not in the count; here they take no part. Empty rows get advantage 0.
    """
    m = mask.to(step_scores.dtype)
    ends = step_end.bool() & mask.bool()
    step_rewards, returns = process_returns(step_scores, ends, m, credit, temperature, gamma)
    base, b = process_baseline(returns, ends, m, group_index, baseline)
    vr = baselines.rloo(rewards.to(m.dtype), group_index)
    adv = c_pr * (returns - base) + c_vr * vr[:, None]
    if kl is not None and kl_coef:
        adv = adv - kl_coef * suffix_sum(kl * m)
    adv = adv * m
    last = torch.zeros_like(ends)
    idx = last_token_index(m)
    rows = torch.nonzero(idx >= 0).squeeze(-1)
    last[rows, idx[rows]] = True
    zeroed = torch.zeros_like(ends)
    if zero_separators:
        zeroed |= ends & ~last
    if zero_final:
        zeroed |= last
    keep = m * (~zeroed).to(m.dtype)
    if do_whiten:
        adv = whiten(adv, keep)
    info = {"step_rewards": step_rewards, "returns": returns, "baseline": base, "b": b,
            "total_process": _first_value(returns, m) if returns.shape[1] else b}
    return adv * keep, info


def step_score_metrics(step_scores: torch.Tensor, step_end: torch.Tensor, mask: torch.Tensor) -> dict:
    """pure/min_step_score (mean over rows with steps of min_k p_k), pure/step_score_mean, pure/num_steps."""
    ends = step_end.bool() & mask.bool()
    has = ends.any(-1)
    zero = torch.zeros(())
    if step_scores.numel() == 0:
        return {"pure/min_step_score": zero, "pure/step_score_mean": zero, "pure/num_steps": zero}
    mins = torch.where(ends, step_scores, torch.full_like(step_scores, float("inf"))).min(-1).values
    return {
        "pure/min_step_score": mins[has].mean() if has.any() else zero,
        "pure/step_score_mean": step_scores[ends].mean() if ends.any() else zero,
        "pure/num_steps": ends.sum(-1)[mask.bool().any(-1)].float().mean() if mask.bool().any() else zero,
    }


def _pure_adv(batch: StepBatch, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    pc = cfg.pure
    m = batch.response_mask.float()
    ends, scores = batch.extras.get("step_end_mask"), batch.extras.get("step_scores")
    if ends is None or scores is None:
        raise ValueError("PURE needs batch.extras['step_end_mask'] and ['step_scores'] from the "
                         "'process_rewards' provider")
    check_step_ends(ends, m)
    if scores.shape != m.shape:
        raise ValueError(f"step_scores has shape {tuple(scores.shape)}, expected {tuple(m.shape)}")
    scores = scores.float()
    if not torch.isfinite(scores[ends.bool()]).all():
        raise ValueError("step_scores holds non-finite values at step ends")
    kl = None
    if pc.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("pure.kl_coef > 0 needs reference log-probs, but the learner provided none")
        kl = (batch.old_logprobs - batch.ref_logprobs).float() * m
    adv, info = pure_advantage(
        scores, ends, m, batch.rewards.float(), batch.group_index,
        credit=pc.credit, temperature=pc.temperature, gamma=pc.gamma, c_pr=pc.c_pr, c_vr=pc.c_vr,
        baseline=pc.baseline, do_whiten=pc.whiten, zero_separators=pc.zero_separators,
        zero_final=pc.zero_final, kl=kl, kl_coef=pc.kl_coef,
    )
    metrics = step_score_metrics(scores, ends, m)
    metrics |= {
        "pure/process_return": info["total_process"].mean() if m.shape[0] else torch.zeros(()),
        "pure/baseline": info["b"].mean() if m.shape[0] else torch.zeros(()),
        "pure/adv_mean": masked_mean(adv, m),
    }
    if kl is not None:
        metrics["pure/kl_ref"] = masked_mean(kl, m)
    return adv, {k: v.detach() for k, v in metrics.items()}


def pure_requirements(cfg: Any) -> frozenset[str]:
    """Spec "pure" inputs: the process-reward provider; ref log-probs for KL-in-reward or a KL loss."""
    extra = {"ref_logprobs"} if cfg.pure.kl_coef > 0 else set()
    return frozenset({"process_rewards"}) | extra | kl_requirements(cfg)


register(AlgoSpec(
    name="pure",
    summary="PURE: min-form credit assignment of PRM step scores + RLOO on the verifiable reward, PPO clip",
    advantage=_pure_adv,
    losses=STANDARD_LOSSES,
    requires=pure_requirements,
))
