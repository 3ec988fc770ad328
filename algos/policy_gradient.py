"""Loss components shared by the policy-gradient algorithms (GRPO, RLOO, PRIME, PURE).

Each is a `LossComponent` for the registry. Options read from `cfg.loss`:
  agg, clip_low, clip_high, dual_clip, is_correction, is_cap, is_mask_low, is_mask_high,
  entropy_coef, kl_coef, kl_estimator.
"""

from __future__ import annotations

from typing import Any

from algos.aggregation import aggregate
from algos.importance import importance_correction
from algos.ppo import kl_penalty, ppo_clip_loss
from algos.registry import LossComponent, LossContext, LossTerm


def clipped_pg(ctx: LossContext, cfg: Any) -> LossTerm:
    """PPO clip on π_θ/π_prox over on-policy tokens, times the behaviour importance correction."""
    b, lc = ctx.batch, cfg.loss
    on = b.on_policy_mask
    tok, metrics = ppo_clip_loss(ctx.logprobs, b.old_logprobs, ctx.advantages, on,
                                 lc.clip_low, lc.clip_high, lc.dual_clip)
    isc = importance_correction(b.old_logprobs, b.behav_logprobs, on, lc.is_correction,
                                lc.is_cap, lc.is_mask_low, lc.is_mask_high)
    loss = aggregate(tok * isc.weight * isc.keep, on, lc.agg, ctx.norm)
    return LossTerm(loss, {f"pg/{k}": v for k, v in metrics.items()} | isc.metrics)


def entropy_bonus(ctx: LossContext, cfg: Any) -> LossTerm:
    """Aggregated token entropy of π_θ; its weight is −entropy_coef (a bonus lowers the loss)."""
    ent = aggregate(ctx.entropy, ctx.batch.response_mask, cfg.loss.agg, ctx.norm)
    return LossTerm(ent, {"entropy": ent.detach()})


def kl_to_reference(ctx: LossContext, cfg: Any) -> LossTerm:
    """KL(π_θ ‖ π_ref) estimate as a loss term (weight kl_coef); needs `ref_logprobs`."""
    b = ctx.batch
    if b.ref_logprobs is None:
        raise ValueError("loss.kl_coef > 0 needs reference log-probs, but the learner provided none")
    kl = aggregate(kl_penalty(ctx.logprobs, b.ref_logprobs, cfg.loss.kl_estimator),
                   b.response_mask, cfg.loss.agg, ctx.norm)
    return LossTerm(kl, {"kl/ref": kl.detach()})


PG = LossComponent("pg", clipped_pg)
ENTROPY = LossComponent("entropy", entropy_bonus, weight=lambda cfg: -cfg.loss.entropy_coef, needs_entropy=True)
KL = LossComponent("kl", kl_to_reference, weight=lambda cfg: cfg.loss.kl_coef)
STANDARD_LOSSES = (PG, ENTROPY, KL)


def kl_requirements(cfg: Any) -> frozenset[str]:
    return frozenset({"ref_logprobs"}) if cfg.loss.kl_coef > 0 else frozenset()
