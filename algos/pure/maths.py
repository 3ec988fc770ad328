"""PURE: min-form credit assignment of PRM step scores, fused with RLOO on the verifiable reward.

ALGORITHMS.md "PURE"; REFERENCE_NOTES §3, §7.7–7.10. Step splitting, the min-form transform and the
credit assignment are in `algos.pure.steps`; options, rules and registration in `algos.pure.options`;
this module holds the baselines and the fusion.

Spec "pure" reads `cfg.pure`: credit, temperature, gamma, c_pr, c_vr, baseline, whiten,
zero_separators, zero_final, kl_coef, kl_estimator; `cfg.rollout.max_response_tokens` (L of the verl
baseline, and L_max of the DAPO soft overlong punishment, `algos.overlong`, applied to `batch.rewards`).
Inputs from the learner's "process_rewards" provider:
`batch.extras["step_end_mask"]` [B, T] bool (every step's last token, the final response token included)
and `batch.extras["step_scores"]` [B, T] float (p_k at step ends, 0 elsewhere); `batch.rewards` [B].
With `pure.kl_coef > 0` the per-token KL-in-reward (`kl_in_reward`: k1, k3 or low_var_kl of
d = log π_prox − log π_ref, from the batch's `old_logprobs` and `ref_logprobs`) is summed undiscounted
from t to the end.

Deviations from the reference: PURE-main takes the KL with the rollout actor's log-probs; here π_prox
(the learner's recomputed log-probs, the same numerics as the reference model) stands in for them.
Group filters (PURE's optional all-0/all-1 curriculum filter) belong to the buffer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from algos import baselines
from algos.batch import StepBatch
from algos.masked import masked_mean, whiten
from algos.overlong import shaped_rewards
from algos.policy_gradient import STANDARD_LOSSES
from algos.ppo import kl_penalty
from algos.pure.options import BASELINES, KL_IN_REWARD, WHITEN_MODES
from algos.pure.steps import process_returns
from algos.returns import last_token_index, suffix_sum
from algos.spec import Maths


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
                         "the final token is always a step end (algos.pure.steps.split_steps)")


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


def verl_baseline(returns: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                  width: int | None = None) -> torch.Tensor:
    """PURE-verl's RLOO baseline b_i [B] of token returns R [B, T] (mirrors PURE-verl
    `compute_rloo_outcome_advantage`, REFERENCE_NOTES §3.5 / §7.9):

        b_i = Σ_{j≠i, g(j)=g(i)} Σ_t R_{j,t}·M_{j,t} / ((n_i − 1)·L),   n_i = size of i's group,

    L = `width`, default the padded width T of `returns` (the reference's L: its responses are always
    padded to max_response_length). The spec passes L = rollout.max_response_tokens, the same constant,
    so the baseline never depends on which rows happen to share the step. L smaller than the longest
    response is a ValueError. Singleton groups get b_i = 0.

    Deviations from the reference: a singleton group divides by zero there.
    """
    m = mask.to(returns.dtype)
    big = returns.shape[-1] if width is None else int(width)
    longest = int(m.sum(-1).max()) if m.shape[0] else 0
    if big < max(longest, 1):
        raise ValueError(f"pure.baseline=verl: L = {big} is shorter than the longest response ({longest} tokens); "
                         "rollout.max_response_tokens must bound every response length")
    if returns.shape[0] == 0:
        return returns.new_zeros(0)
    total = (returns * m).sum(-1)
    g = int(group_index.max()) + 1
    n = baselines.group_sum(torch.ones_like(total), group_index, g)[group_index]
    others = baselines.group_sum(total, group_index, g)[group_index] - total
    return torch.where(n > 1, others / ((n - 1.0).clamp_min(1.0) * big), torch.zeros_like(total))


def process_baseline(
    returns: torch.Tensor,
    step_end: torch.Tensor,
    mask: torch.Tensor,
    group_index: torch.Tensor,
    mode: str = "token",
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Baseline of the process return: (baseline_t [B, T], b_i [B]).

    O_j = process return at row j's first token (for min-form: Σ_k r_{j,k}); len_j = Σ_t M (separators
    and the final token counted); K_j = #steps; ntok_{j,k} = tokens of step k excluding its end token.
      token (PURE-main default): b_i = Σ_{j≠i} O_j / Σ_{j≠i} len_j, and b_i·ntok_{i,k} is subtracted at
            step k's end, so baseline_t = b_i · Σ_{k : e_k ≥ t} ntok_{i,k}.
      step:  b_i = mean_{j≠i, K_j>0} O_j / K_j, subtracted at every step end:
            baseline_t = b_i · #{k : e_k ≥ t}.
      verl:  b_i = `verl_baseline(returns, mask, group_index, width)` (PURE-verl; `width` = L),
            subtracted from every response token: baseline_t = b_i·M_t. `pure_advantage` passes the fused
            return (process + outcome − KL), as the reference's token_level_rewards hold all three.
    Singleton groups, or groups whose other rows are empty, have b_i = 0. Padding holds 0.
    `width` is read by verl only.
    """
    if mode not in BASELINES:
        raise ValueError(f"unknown pure.baseline {mode!r}; choose one of {BASELINES}")
    m = mask.to(returns.dtype)
    ends = (step_end.bool() & mask.bool()).to(returns.dtype)
    if mode == "verl":
        b = verl_baseline(returns, m, group_index, width)
        return b[:, None] * m, b
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


def pure_main_normalize(adv: torch.Tensor, mask: torch.Tensor, exclude_zeros: bool = True) -> torch.Tensor:
    """PURE-main's buffer normalisation of advantages [B, T] over all masked tokens of the batch (mirrors
    PURE-main `NaiveReplayBuffer.normalize`, REFERENCE_NOTES §3.4 "Buffer normalisation"):

        Z   = {masked tokens whose advantage is exactly 0}   (empty when not `exclude_zeros`)
        N'  = Σ M − |Z|
        μ   = Σ A·M / N'
        var = Σ (A − μ)²·M / N'          (the zeros' (0 − μ)² stay in the numerator; no Bessel)
        A  ← (A − μ)·max(var, 1e-8)^(−1/2), then 0 on Z and on padding.

    `exclude_zeros` is the reference's mask_separator_adv (on unless nomask_separator_adv); the spec
    passes `zero_separators or zero_final`. Any exact zero counts, not only separators, as the reference
    detects them by value.

    Deviations from the reference: N' = 0 (every advantage 0) returns zeros instead of NaN. The reference
    normalises its whole rollout buffer, which may span several optimiser steps; here it is the step's
    global batch (all ranks, as its all-reduce).
    """
    m = mask.to(adv.dtype)
    zeros = (adv == 0) & (m > 0) if exclude_zeros else torch.zeros_like(m, dtype=torch.bool)
    count = m.sum() - zeros.to(adv.dtype).sum()
    if count <= 0:
        return torch.zeros_like(adv)
    mean = (adv * m).sum() / count
    var = ((adv - mean).square() * m).sum() / count
    out = (adv - mean) * torch.rsqrt(var.clamp_min(1e-8))
    return torch.where(zeros, torch.zeros_like(out), out) * m


def kl_in_reward(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor,
                 estimator: str = "k1") -> torch.Tensor:
    """Per-token KL-in-reward term [B, T] (0 off the mask), d = log π − log π_ref, with the estimators of
    `algos.ppo.kl_penalty` (one meaning per name):

      k1          d                                  (PURE-main default)
      k3          exp(−d) − 1 + d, unclamped         (PURE-main `use_kl_estimator_k3`, OpenRLHF)
      low_var_kl  k3 with −d clamped to ±20 and the value to [−10, 10]  (PURE-verl `kl_penalty: low_var_kl`)
    """
    if estimator not in KL_IN_REWARD:
        raise ValueError(f"unknown pure.kl_estimator {estimator!r}; choose one of {KL_IN_REWARD}")
    m = mask.to(logprobs.dtype)
    if estimator == "low_var_kl":  # clamped, so the unmasked value is finite on padding too
        return kl_penalty(logprobs, ref_logprobs, estimator) * m
    return kl_penalty(logprobs * m, ref_logprobs * m, estimator) * m


def _whiten_mode(do_whiten: bool | str) -> str:
    mode = {False: "none", True: "batch"}.get(do_whiten, do_whiten) if isinstance(do_whiten, bool) else do_whiten
    if mode not in WHITEN_MODES:
        raise ValueError(f"unknown pure.whiten {do_whiten!r}; choose one of {WHITEN_MODES}")
    return mode


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
    do_whiten: bool | str = False,
    zero_separators: bool = True,
    zero_final: bool = False,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    width: int | None = None,
    vr_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PURE advantages [B, T] (0 outside the mask and at zeroed positions) and intermediate tensors.

    With R from `pure_steps.process_returns` (credit, temperature, gamma), kl [B, T] the per-token
    KL-in-reward term (optional, `kl_in_reward`) and K_t = kl_coef·Σ_{s≥t} kl_s:
      baseline token | step (PURE-main):
          A_t = c_pr·(R_t − baseline_t) + c_vr·(v_i − mean_{j≠i} v_j) − K_t,
          baseline from `process_baseline`, the RLOO of `algos.baselines.rloo` (a singleton keeps v_i);
      baseline verl (PURE-verl): the fused return G_t = c_pr·R_t + c_vr·v_i − K_t (v_i at the last token,
          summed undiscounted, so it sits on every response token) gets the verl baseline
          (`verl_baseline`, L = `width`, default T): A_t = G_t − b_i. No separate RLOO of v.
    on every response token. Then:
      zeroed = separators (step ends other than the final token; `zero_separators`, default on)
               ∪ final response token (`zero_final`, the PURE-main reference behaviour);
      `do_whiten` (False = "none", True = "batch", or "pure_main"):
          batch     Bessel whitening over the response tokens that are not zeroed (< 2 such tokens is a
                    ValueError), as PURE-verl's adv_norm when nothing is zeroed;
          pure_main `pure_main_normalize` over all response tokens, exact zeros out of the count when
                    any position is zeroed (zero_separators or zero_final);
      zeroed tokens get advantage 0.
    The info dict holds step_rewards, returns, baseline [B, T], b [B], total_process [B].

    Reference settings: PURE-main = baseline token (or step), zero_separators and zero_final on,
    do_whiten "pure_main", KL k1 (or k3) with kl_coef 0.001, loss.agg seq-mean-token-mean. PURE-verl =
    baseline verl with width = its max_response_length, zero_separators off, do_whiten "batch", KL
    low_var_kl with kl_coef 0.001, loss.agg token-mean.
    vr_rows [B] (optional, `pure.vr_fraction` < 1): 1 where the row's prompt gets the verifiable reward,
    0 elsewhere; the c_vr term above (v_i in the verl fused return, the RLOO term otherwise) is multiplied
    by it. A prompt's rows share the value, so the RLOO stays within groups of equal weight.
    Deviations from the reference: the VR reward scale ({−1, 0} in PURE-main, {0, 1} in PURE-verl) is
    irrelevant for token/step (RLOO is shift-invariant) but not for verl, whose baseline spreads the
    others' VR over L tokens: give v ∈ {0, 1} to match PURE-verl. Empty rows get advantage 0.
    """
    mode = _whiten_mode(do_whiten)
    m = mask.to(step_scores.dtype)
    ends = step_end.bool() & mask.bool()
    step_rewards, returns = process_returns(step_scores, ends, m, credit, temperature, gamma)
    kl_return = kl_coef * suffix_sum(kl * m) if kl is not None and kl_coef else torch.zeros_like(m)
    vr_w = torch.ones_like(m[:, 0]) if vr_rows is None else vr_rows.to(m.dtype)
    if baseline == "verl":
        fused = c_pr * returns + c_vr * (vr_w * rewards.to(m.dtype))[:, None] * m - kl_return
        base, b = process_baseline(fused, ends, m, group_index, baseline, width)
        adv = fused - base
    else:
        base, b = process_baseline(returns, ends, m, group_index, baseline)
        vr = baselines.rloo(rewards.to(m.dtype), group_index)
        adv = c_pr * (returns - base) + c_vr * (vr_w * vr)[:, None] - kl_return
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
    if mode == "batch":
        adv = whiten(adv, keep)
    elif mode == "pure_main":
        adv = pure_main_normalize(adv * keep, m, exclude_zeros=zero_separators or zero_final)
    info = {"step_rewards": step_rewards, "returns": returns, "baseline": base, "b": b,
            "total_process": _first_value(returns, m) if returns.shape[1] else b}
    return adv * keep, info


def vr_prompt(prompt_ids: Sequence[int], seed: int, fraction: float) -> bool:
    """Whether a prompt gets the verifiable reward under `pure.vr_fraction`: u < fraction with u the first 8
    bytes of blake2b("<seed>:" + the prompt's token ids, comma-separated) read as an integer / 2^64. It
    depends only on the prompt and the run seed, so a prompt is in or out for the whole run and every rank
    agrees; fraction 1 takes every prompt, 0 none."""
    if fraction >= 1.0:
        return True
    text = f"{seed}:" + ",".join(str(int(t)) for t in prompt_ids)
    u = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64
    return u < fraction


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
        kl = kl_in_reward(batch.old_logprobs.float(), batch.ref_logprobs.float(), m, pc.kl_estimator)
    rewards, overlong_metrics = shaped_rewards(batch, cfg)
    vr_rows = batch.extras.get("vr_rows")
    if pc.vr_fraction < 1.0 and vr_rows is None:
        raise ValueError("pure.vr_fraction < 1 needs batch.extras['vr_rows'] from the 'process_rewards' provider")
    adv, info = pure_advantage(
        scores, ends, m, rewards, batch.group_index,
        credit=pc.credit, temperature=pc.temperature, gamma=pc.gamma, c_pr=pc.c_pr, c_vr=pc.c_vr,
        baseline=pc.baseline, do_whiten=pc.whiten, zero_separators=pc.zero_separators,
        zero_final=pc.zero_final, kl=kl, kl_coef=pc.kl_coef, width=cfg.rollout.max_response_tokens,
        vr_rows=vr_rows if pc.vr_fraction < 1.0 else None,
    )
    metrics = step_score_metrics(scores, ends, m) | overlong_metrics
    metrics |= {
        "pure/process_return": info["total_process"].mean() if m.shape[0] else torch.zeros(()),
        "pure/baseline": info["b"].mean() if m.shape[0] else torch.zeros(()),
        "pure/adv_mean": masked_mean(adv, m),
    }
    if pc.vr_fraction < 1.0:
        metrics["pure/vr_row_frac"] = vr_rows.float().mean() if m.shape[0] else torch.zeros(())
    if kl is not None:
        metrics["pure/kl_ref"] = masked_mean(kl, m)
    return adv, {k: v.detach() for k, v in metrics.items()}


MATHS = Maths(losses=STANDARD_LOSSES, advantage=_pure_adv)
