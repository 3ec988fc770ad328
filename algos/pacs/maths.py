"""PACS (seed 004): RL as supervised learning — BCE between an implicit score's advantage and the outcome.

ALGORITHMS.md "PACS", REFERENCE_NOTES §5. Per row i with outcome label v_i ∈ {0, 1}:
  r̂_i  = β Σ_t (log π_θ − log π_prox)·M         (method 1, default)
       = β (Σ_t log π_θ·M) / T_i                (method 2), T_i = Σ_t M
  Â_i  = group baseline of r̂ (rloo default, grpo, naive = r̂ itself), within each prompt's group
  w_i  = weight_mode: question (sklearn "balanced" within groups that hold both labels, else 1),
         only_positive, only_negative, none (1)
  loss = Σ_i w_i·BCEWithLogits(Â_i, v_i) / #rows of the optimiser step

The score depends on π_θ, so there is no precomputed advantage: the loss computes r̂ and Â from the
micro-batch's log-probs (the spec asks the learner for micro-batches that hold whole groups). No PPO
ratio, no clipping, no KL, no entropy; a non-finite gradient skips the step; gradients are not clipped.

Spec "pacs" (options, rules, registration: `algos.pacs.options`) reads `cfg.pacs` (method, beta,
estimator, use_std, weight_mode, and optionally masked_score, default True; False = the reference's
unmasked sums). Metrics "pacs/...".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from algos import baselines
from algos.aggregation import aggregate_rows
from algos.batch import LossContext, LossTerm
from algos.importance import importance_correction
from algos.masked import masked_mean
from algos.pacs.options import PACS_ESTIMATORS, ROW_IS_MODES, WEIGHT_MODES
from algos.spec import LossComponent, Maths


def pacs_score(logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor,
               method: int = 1, beta: float = 1.0, masked: bool = True) -> torch.Tensor:
    """Implicit score r̂ [B] from log-probs [B, T] (gradient through `logprobs`; `old_logprobs` detached).

    method 1: β Σ_t (log π_θ − log π_old)·M;   method 2: β Σ_t log π_θ·M / max(T_i, 1).
    `masked=False` reproduces the reference, which sums over all T columns with no mask (only T_i of
    method 2 comes from the mask); it equals the masked sum when padded log-probs are 0, as with the
    reference's remove-padding path. The default masks: a padded position never contributes.

    Deviations from the reference: masked sums by default (option `masked=False` for the reference);
    an empty row (T_i = 0) gets score 0 under method 2 instead of a division by zero.
    """
    method = int(method)
    if method not in (1, 2):
        raise ValueError(f"pacs.method must be 1 or 2, got {method}")
    m = response_mask.to(logprobs.dtype)
    w = m if masked else torch.ones_like(m)
    if method == 1:
        return beta * ((logprobs - old_logprobs.detach()) * w).sum(-1)
    return beta * (logprobs * w).sum(-1) / m.sum(-1).clamp_min(1.0)


def _dense_groups(group_index: torch.Tensor) -> torch.Tensor:
    """Renumber group ids [B] to 0..G'−1 (a micro-batch holds a subset of the step's groups)."""
    return torch.unique(group_index, return_inverse=True)[1]


def pacs_advantage(scores: torch.Tensor, group_index: torch.Tensor, estimator: str = "rloo",
                   use_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Â [B] from scores [B] within groups (group_index [B] int64, any ids, rows need not be contiguous).

      rloo:  r̂_i − mean_{j≠i} r̂_j (singleton: r̂_i);   grpo: (r̂_i − mean)/(std_unbiased + eps), or
      r̂_i − mean with use_std=False (singleton: mean 0, std 1);   naive: r̂_i.
    Deviations from the reference: groups come from group_index instead of contiguous blocks of n, so
    unequal or interleaved groups work; a singleton group (the reference divides by n − 1 = 0) follows
    the shared baselines' conventions above.
    """
    if estimator not in PACS_ESTIMATORS:
        raise ValueError(f"unknown pacs estimator {estimator!r}; choose one of {PACS_ESTIMATORS}")
    gi = _dense_groups(group_index)
    if estimator == "rloo":
        return baselines.rloo(scores, gi)
    if estimator == "grpo":
        return baselines.grpo(scores, gi, use_std=use_std, eps=eps)
    return baselines.reinforce(scores, gi)


def pacs_weights(labels: torch.Tensor, group_index: torch.Tensor, mode: str = "question") -> torch.Tensor:
    """Row weights w [B] (float32) from binary labels [B] ∈ {0, 1} and group_index [B].

      question:      in a group of n rows holding both labels, w_i = n / (2·count_g(v_i)) (scikit-learn's
                     "balanced" class weight); a group with a single label gets 1
      only_positive: w = 1 if v = 1 else 0;  only_negative: w = 1 if v = 0 else 0;  none: w = 1.
    Labels other than 0/1 raise ValueError (except with mode none, where BCE accepts soft targets).
    Deviations from the reference: groups from group_index instead of contiguous blocks of n.
    """
    if mode not in WEIGHT_MODES:
        raise ValueError(f"unknown pacs weight_mode {mode!r}; choose one of {WEIGHT_MODES}")
    v = labels.to(torch.float32)
    if mode == "none":
        return torch.ones_like(v)
    if not bool(((v == 0) | (v == 1)).all()):
        raise ValueError(f"pacs weight_mode {mode!r} needs binary outcome labels in {{0, 1}}; got "
                         f"{sorted(set(v.tolist()))[:6]}")
    if mode == "only_positive":
        return (v == 1).to(torch.float32)
    if mode == "only_negative":
        return (v == 0).to(torch.float32)
    gi = _dense_groups(group_index)
    g = int(gi.max()) + 1 if gi.numel() else 0
    n = baselines.group_sum(torch.ones_like(v), gi, g)
    pos = baselines.group_sum(v, gi, g)
    neg = n - pos
    both = (pos > 0) & (neg > 0)
    same_label = torch.where(v == 1, pos[gi], neg[gi])
    balanced = n[gi] / (2.0 * same_label.clamp_min(1.0))
    return torch.where(both[gi], balanced, torch.ones_like(v))


def _singleton_frac(group_index: torch.Tensor) -> torch.Tensor:
    if group_index.numel() == 0:
        return torch.zeros(())
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    return (counts[inverse] == 1).float().mean()


def pacs_row_losses(logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor,
                    labels: torch.Tensor, group_index: torch.Tensor, method: int = 1, beta: float = 1.0,
                    estimator: str = "rloo", use_std: bool = True, weight_mode: str = "question",
                    masked: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-row weighted BCE [B]: w_i·BCEWithLogits(Â_i, v_i), plus detached diagnostics.

    The caller reduces it (`aggregate_rows`: Σ / #rows of the step; with a single batch, the reference's
    mean over rows, not normalised by Σw). Rows of one group must all be present (Â is a group
    statistic). At θ = θ_old, method 1 gives r̂ = Â = 0, the loss is ln 2·mean(w), and the gradient is
    (β/B)·Σ_i w_i(½ − v_i)·∇(ℓ_i − mean_{j≠i} ℓ_j) ≠ 0.
    Deviations from the reference: see `pacs_score`, `pacs_advantage`, `pacs_weights`.
    """
    v = labels.to(logprobs.dtype)
    score = pacs_score(logprobs, old_logprobs, response_mask, method, beta, masked)
    adv = pacs_advantage(score, group_index, estimator, use_std)
    w = pacs_weights(labels, group_index, weight_mode).to(logprobs.dtype)
    rows = F.binary_cross_entropy_with_logits(adv, v, weight=w, reduction="none")
    with torch.no_grad():
        metrics = {
            "pacs/score_mean": score.mean() if score.numel() else torch.zeros(()),
            "pacs/adv_abs_mean": adv.abs().mean() if adv.numel() else torch.zeros(()),
            "pacs/weight_mean": w.mean() if w.numel() else torch.zeros(()),
            "pacs/pred_acc": ((adv > 0) == (v > 0.5)).to(v.dtype).mean() if v.numel() else torch.zeros(()),
            # rows alone in their group within this micro-batch: Â degenerates (rloo/naive: r̂; grpo: r̂).
            # Non-zero means a group was split across micro-batches or has a single sample.
            "pacs/singleton_row_frac": _singleton_frac(group_index),
        }
    return rows, metrics


def sequence_ratio(prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_i = exp(mean_t (log π_prox − log μ)) over the row's on-policy tokens (`mask` [B, T]): the
    length-normalised sequence ratio (geometric mean of the token ratios, as in GSPO); 1 for a row
    without on-policy tokens. [B, T] -> [B], detached."""
    m = mask.to(prox_logprobs.dtype)
    d = (prox_logprobs - behav_logprobs).detach().clamp(-20.0, 20.0) * m
    return torch.exp(d.sum(-1) / m.sum(-1).clamp_min(1.0))


def row_importance_weight(ratio: torch.Tensor, mode: str = "tis", cap: float = 2.0, cap_min: float = 0.5,
                          cap_max: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """PACS' behaviour correction per row (`loss.is_correction`) from `sequence_ratio` s [B]:
    (weight c [B], corrected [B] bool — rows truncated or dropped).

      tis → c = min(s, C);   mask → c = 1 if C_min ≤ s ≤ C_max else 0;   none → c = 1.
    `decoupled` is refused: it decouples a PPO clip, and PACS has none.
    PACS' loss is a BCE per row, not a sum over tokens, so the correction weights rows.
    Deviations from the paper/reference: PACS is synchronous there and has no behaviour correction.
    The unbiased sequence weight Π_t π_prox/μ has a variance that grows with the length; the
    length-normalised ratio trades that bias for bounded variance.
    """
    if mode not in ROW_IS_MODES:
        raise ValueError(f"loss.is_correction={mode!r} is not defined for PACS: it decouples a PPO clip and "
                         f"PACS has none — use one of {ROW_IS_MODES}")
    if mode == "tis":
        return torch.clamp(ratio, max=cap), ratio > cap
    if mode == "mask":
        keep = (ratio >= cap_min) & (ratio <= cap_max)
        return keep.to(ratio.dtype), ~keep
    return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)


def bce_loss(ctx: LossContext, cfg: Any) -> LossTerm:
    """LossComponent "pacs_bce": Σ_i c_i·w_i·BCE(Â_i, v_i) / (#rows of the step, ctx.norm.num_rows).

    r̂ uses ctx.logprobs (π_θ) and ctx.batch.old_logprobs (π_prox); labels are ctx.batch.rewards; c_i is
    the behaviour correction of `row_importance_weight` (cfg.loss.is_correction, is_cap, is_mask_low,
    is_mask_high), times 0 for truncated rows under DAPO's overlong filter (cfg.loss.overlong_filter; they
    stay in the row count, as a token dropped by the IS correction stays in a token count). Metrics: the pacs/* diagnostics; the token-level is/* and mismatch/kl diagnostics
    every algorithm logs, except is/clip_frac, replaced by pacs/is_row_clip_frac (rows truncated or
    dropped); pg/ppo_kl = mean over response tokens of log π_prox − log π_θ (how far the earlier
    optimiser steps of this learner step moved the policy; 0 at the first).
    Deviations from the reference: the reference averages over the rows of each micro-batch and then
    divides by the number of micro-batches; the global row count is the same when micro-batches are
    equal, and keeps the gradient independent of the split when they are not.
    """
    b, pc, lo = ctx.batch, cfg.pacs, cfg.loss
    rows, metrics = pacs_row_losses(ctx.logprobs, b.old_logprobs, b.response_mask, b.rewards, b.group_index,
                                    method=pc.method, beta=pc.beta, estimator=pc.estimator,
                                    use_std=pc.use_std, weight_mode=pc.weight_mode,
                                    masked=pc.masked_score)
    on = b.on_policy_mask
    c, corrected = row_importance_weight(sequence_ratio(b.old_logprobs, b.behav_logprobs, on), lo.is_correction,
                                         lo.is_cap, lo.is_mask_low, lo.is_mask_high)
    kept = (~b.truncated).to(c.dtype) if lo.overlong_filter and b.truncated is not None else torch.ones_like(c)
    loss = aggregate_rows(rows * c * kept, ctx.norm)
    diag = importance_correction(b.old_logprobs, b.behav_logprobs, on, "none").metrics
    diag.pop("is/clip_frac")
    metrics |= diag | {
        "pacs/is_row_clip_frac": corrected.to(c.dtype).mean() if c.numel() else torch.zeros(()),
        "pg/ppo_kl": masked_mean(b.old_logprobs - ctx.logprobs.detach(), b.response_mask),
    }
    return LossTerm(loss, {"pacs/bce": loss.detach()} | metrics, summed=frozenset({"pacs/bce"}))


BCE = LossComponent("pacs_bce", bce_loss)
MATHS = Maths(losses=(BCE,))
