"""Loss components shared by the policy-gradient algorithms (GRPO, RLOO, PRIME, PURE).

Each is a `LossComponent` for the registry. Options read from `cfg.loss`:
  agg, clip_low, clip_high, dual_clip, ratio_level, is_correction, is_cap, is_mask_low, is_mask_high,
  entropy_coef, kl_coef, kl_estimator, overlong_filter.
Every term's loss mask goes through `algos.overlong.loss_mask` (DAPO overlong filtering: truncated rows
out of the loss when loss.overlong_filter), so every algorithm using these terms honours it.
"""

from __future__ import annotations

from typing import Any

from algos.aggregation import aggregate
from algos.batch import LossContext, LossTerm
from algos.importance import importance_correction
from algos.overlong import loss_mask
from algos.ppo import kl_penalty, ppo_clip_loss
from algos.spec import LossComponent


def clipped_pg(ctx: LossContext, cfg: Any) -> LossTerm:
    """PPO clip on π_θ/π_prox over on-policy tokens, times the behaviour importance correction.

    Loss mask M = on-policy tokens minus DAPO-filtered rows. ℓ_t = ppo_clip_loss(ratio_level)·w_t·keep_t
    with (w, keep) from `importance_correction(π_prox, μ, M, is_correction)`, aggregated with loss.agg.
    GSPO (ratio_level "sequence"): s_i is taken over M (tokens dropped by the IS correction still enter
    it, s_i measures π_θ/π_prox only); the behaviour correction stays per token, multiplying the clipped
    surrogate as with token ratios (for "decoupled" the clip is therefore on the sequence ratio
    π_θ/π_prox and the per-token weight π_prox/μ multiplies it); dual_clip acts per token.
    Metric overlong/filtered_frac: share of on-policy tokens removed by the overlong filter.
    """
    b, lc = ctx.batch, cfg.loss
    on_all = b.on_policy_mask
    on = loss_mask(b, on_all, cfg)
    tok, metrics = ppo_clip_loss(ctx.logprobs, b.old_logprobs, ctx.advantages, on,
                                 lc.clip_low, lc.clip_high, lc.dual_clip, lc.ratio_level)
    isc = importance_correction(b.old_logprobs, b.behav_logprobs, on, lc.is_correction,
                                lc.is_cap, lc.is_mask_low, lc.is_mask_high)
    loss = aggregate(tok * isc.weight * isc.keep, on, lc.agg, ctx.norm)
    out = {f"pg/{k}": v for k, v in metrics.items()} | isc.metrics
    if lc.overlong_filter:
        out["overlong/filtered_frac"] = (1.0 - on.sum() / on_all.sum().clamp_min(1.0)).detach()
    return LossTerm(loss, out)


def entropy_bonus(ctx: LossContext, cfg: Any) -> LossTerm:
    """Aggregated token entropy of π_θ over the loss mask (response tokens minus DAPO-filtered rows);
    its weight is −entropy_coef (a bonus lowers the loss)."""
    b = ctx.batch
    ent = aggregate(ctx.entropy, loss_mask(b, b.response_mask, cfg), cfg.loss.agg, ctx.norm)
    return LossTerm(ent, {"entropy": ent.detach()}, summed=frozenset({"entropy"}))


def kl_to_reference(ctx: LossContext, cfg: Any) -> LossTerm:
    """KL(π_θ ‖ π_ref) estimate over the loss mask (response tokens minus DAPO-filtered rows) as a loss
    term (weight kl_coef); needs `ref_logprobs`."""
    b = ctx.batch
    if b.ref_logprobs is None:
        raise ValueError("loss.kl_coef > 0 needs reference log-probs, but the learner provided none")
    kl = aggregate(kl_penalty(ctx.logprobs, b.ref_logprobs, cfg.loss.kl_estimator),
                   loss_mask(b, b.response_mask, cfg), cfg.loss.agg, ctx.norm)
    return LossTerm(kl, {"kl/ref": kl.detach()}, summed=frozenset({"kl/ref"}))


PG = LossComponent("pg", clipped_pg)
ENTROPY = LossComponent("entropy", entropy_bonus, weight=lambda cfg: -cfg.loss.entropy_coef, needs_entropy=True)
KL = LossComponent("kl", kl_to_reference, weight=lambda cfg: cfg.loss.kl_coef)
STANDARD_LOSSES = (PG, ENTROPY, KL)  # the KL term's inputs: `algos.spec.kl_requirements`
