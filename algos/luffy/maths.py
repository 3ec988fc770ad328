"""LUFFY (seed 001): RL with off-policy guidance from teacher demonstrations and policy shaping.

Pieces (ALGORITHMS.md "LUFFY", REFERENCE_NOTES §4):
  - prefix ratios and guided-row construction: `algos.luffy.prefix` (used by the actors),
  - the advantage (`luffy_advantage`): grpo_split (default) or grpo over the outcome reward, with the
    extreme-group filter and the α/β prefix weights,
  - the mixed on/off-policy token loss: `algos.luffy.loss`, aggregated here (`luffy_policy_loss`) and,
    on on-policy tokens, multiplied by the behaviour importance correction (`algos.importance`).

Spec "luffy" (options, rules, registration: `algos.luffy.options`) reads `cfg.luffy` (estimator,
use_std, alpha, beta, the reshape/clip options, use_target_probs, and optionally
filter_extreme_groups, default True) and `cfg.loss` (agg, clip_low,
clip_high, dual_clip, is_correction, is_cap, is_mask_low, is_mask_high, entropy_coef, kl_coef,
kl_estimator, and the DAPO options overlong_filter / overlong_cache_tokens / overlong_penalty_factor of
`algos.overlong`; ratio_level must be "token"). With `use_target_probs` the learner must provide
extras["target_probs"] [B, T].
"""

from __future__ import annotations

from typing import Any

import torch

from algos import baselines
from algos.aggregation import LossNorm, aggregate
from algos.batch import LossContext, LossTerm, StepBatch
from algos.importance import importance_correction
from algos.luffy.loss import luffy_token_loss
from algos.luffy.options import LUFFY_ESTIMATORS
from algos.overlong import loss_mask, shaped_rewards
from algos.policy_gradient import ENTROPY, KL
from algos.spec import LossComponent, Maths


def extreme_group_keep(rewards: torch.Tensor, group_index: torch.Tensor, low: float = 0.0,
                       high: float = 1.0) -> torch.Tensor:
    """[B] bool: False for the rows of groups whose rewards are all `low` or all `high` (the seed's
    rejection sampling: such a group carries no learning signal). Every row of the group counts,
    demonstration-guided ones included.

    Deviations from the reference: the reference only logs this mask; the seed (and we) apply it.
    """
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError("rewards and group_index must both be [B]")
    if rewards.numel() == 0:
        return torch.ones(0, dtype=torch.bool)
    g = int(group_index.max()) + 1
    count = baselines.group_sum(torch.ones_like(rewards, dtype=torch.float64), group_index, g)
    n_low = baselines.group_sum((rewards == low).to(torch.float64), group_index, g)
    n_high = baselines.group_sum((rewards == high).to(torch.float64), group_index, g)
    extreme = (n_low == count) | (n_high == count)
    return ~extreme[group_index]


def luffy_advantage(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    prefix_mask: torch.Tensor,
    response_mask: torch.Tensor,
    estimator: str = "grpo_split",
    use_std: bool = True,
    alpha: float = 1.0,
    beta: float = 1.0,
    eps: float = 1e-6,
    filter_extreme: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token advantages [B, T] and metrics.

    rewards [B] (outcome), group_index [B] int64, prefix_mask [B, T] bool, response_mask [B, T].
    A row is off-policy when any of its response tokens is a demonstration token; otherwise on-policy.
      grpo_split: A_i = (v_i − mean_on)/(std_on + eps), statistics over the group's on-policy rows,
                  std 0 → 1, one on-policy row → mean 0 / std 1, none → ValueError;
      grpo:       all rows in the statistics (the reference script); singleton group → mean 0, std 1.
      use_std=False drops the division. A_i is broadcast over M and multiplied by α on demonstration
      tokens, β elsewhere. With `filter_extreme`, rows of all-0 / all-1 groups get advantage 0.

    Deviations from the reference: the filter is applied (the reference only logs it); its rows still
    reach the loss with A = 0 (removing them from the loss normaliser needs a learner-side row filter).
    """
    if estimator not in LUFFY_ESTIMATORS:
        raise ValueError(f"unknown luffy estimator {estimator!r}; choose one of {LUFFY_ESTIMATORS}")
    scores = rewards.to(torch.float32)
    m = response_mask.to(scores.dtype)
    pre = prefix_mask.bool() & (m > 0)
    off_row = pre.any(dim=-1)
    if estimator == "grpo_split":
        adv = baselines.grpo_split(scores, group_index, ~off_row, use_std=use_std, eps=eps)
    else:
        adv = baselines.grpo(scores, group_index, use_std=use_std, eps=eps)
    keep = extreme_group_keep(scores, group_index) if filter_extreme else torch.ones_like(off_row)
    adv = adv * keep.to(adv.dtype)
    weight = torch.where(pre, torch.full_like(m, alpha), torch.full_like(m, beta))
    tok = adv[:, None] * m * weight
    n_tok = m.sum().clamp_min(1.0)
    n_off = off_row.sum().clamp_min(1)
    n_on = (~off_row).sum().clamp_min(1)
    metrics = {
        "luffy/offpolicy_frac": pre.to(m.dtype).sum() / n_tok,
        "luffy/offpolicy_row_frac": off_row.to(m.dtype).mean() if off_row.numel() else torch.zeros(()),
        "luffy/extreme_row_frac": (~keep).to(m.dtype).mean() if keep.numel() else torch.zeros(()),
        "luffy/reward_offpolicy": (scores * off_row).sum() / n_off,
        "luffy/reward_onpolicy": (scores * ~off_row).sum() / n_on,
        "luffy/adv_offpolicy": (adv * off_row).sum() / n_off,
    }
    return tok, metrics


def luffy_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                      response_mask: torch.Tensor, prefix_mask: torch.Tensor, agg: str = "token-mean",
                      norm: LossNorm | None = None, **options: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar LUFFY policy loss: `luffy_token_loss(**options)` aggregated over the response tokens.

    `norm=None` reproduces the reference on a single batch: normalisers from the loss mask after
    all_max_clip, T_pad = the padded width; the reference's `loss_remove_token_mean=True` is
    agg="seq-mean-token-sum-norm" (Σ ℓ·M / T_pad), False is "token-mean".
    Deviations from the reference: with the learner's global `norm`, tokens dropped by all_max_clip
    still count in the normaliser (as IS-dropped tokens do), so dropping never rescales other tokens.
    """
    out = luffy_token_loss(logprobs, old_logprobs, advantages, response_mask, prefix_mask, **options)
    if norm is None:
        norm = LossNorm.local(out.mask, max_len=response_mask.shape[-1])
    return aggregate(out.loss, out.mask, agg, norm), out.metrics


def _luffy_options(cfg: Any) -> dict[str, Any]:
    lc, lo = cfg.luffy, cfg.loss
    return dict(
        clip_low=lo.clip_low, clip_high=lo.clip_high, dual_clip=lo.dual_clip,
        clip_upper_bound=lc.clip_upper_bound, remove_clip=lc.remove_clip,
        on_policy_reshape=lc.on_policy_reshape, on_policy_reshape_weight=lc.on_policy_reshape_weight,
        on_policy_reshape_pow_exp=lc.on_policy_reshape_pow_exp,
        off_policy_reshape=lc.off_policy_reshape, off_policy_reshape_weight=lc.off_policy_reshape_weight,
        off_policy_reshape_pow_exp=lc.off_policy_reshape_pow_exp,
        off_max_clip=lc.off_max_clip, off_min_clip=lc.off_min_clip, all_max_clip=lc.all_max_clip,
    )


def _luffy_adv(batch: StepBatch, cfg: Any):
    lc = cfg.luffy
    rewards, overlong_metrics = shaped_rewards(batch, cfg)
    adv, metrics = luffy_advantage(rewards, batch.group_index, batch.prefix_mask, batch.response_mask,
                                   estimator=lc.estimator, use_std=lc.use_std, alpha=lc.alpha, beta=lc.beta,
                                   filter_extreme=lc.filter_extreme_groups)
    return adv, metrics | overlong_metrics


def mixed_policy_loss(ctx: LossContext, cfg: Any) -> LossTerm:
    """The LUFFY policy loss of one micro-batch (LossComponent "luffy_pg").

    ℓ = ℓ_off on demonstration tokens, ℓ_on·w_IS on generated tokens, where w_IS·keep is
    `importance_correction(π_prox, μ, on-policy mask, cfg.loss.is_correction, ...)`: the asynchronous
    behaviour-policy correction, applied on top of LUFFY's own loss and only to generated tokens
    (demonstration tokens have no μ). With is_correction="none" this is exactly the reference loss.
    Aggregated with cfg.loss.agg over all response tokens (minus DAPO-filtered rows, `overlong.loss_mask`)
    under the global ctx.norm. A micro-batch without demonstration tokens, or without generated ones,
    gives a finite loss (every masked mean of an empty mask is 0; the reference's on_pg_loss is NaN there).
    loss.ratio_level="sequence" (GSPO) is a ValueError: LUFFY's reshaped on-policy ratio is per token.
    """
    b, lo = ctx.batch, cfg.loss
    if lo.ratio_level != "token":
        raise ValueError(f"loss.ratio_level={lo.ratio_level!r} is not supported by luffy's mixed loss (its on-policy "
                         "ratio is reshaped per token) — set loss.ratio_level=token")
    response = loss_mask(b, b.response_mask, cfg)
    on = response * (~b.prefix_mask).to(response.dtype)
    isc = importance_correction(b.old_logprobs, b.behav_logprobs, on, lo.is_correction,
                                lo.is_cap, lo.is_mask_low, lo.is_mask_high)
    target_probs = None
    if cfg.luffy.use_target_probs:
        if "target_probs" not in b.extras:
            raise ValueError("luffy.use_target_probs needs extras['target_probs'], but the learner provided none")
        target_probs = b.extras["target_probs"]
    loss, metrics = luffy_policy_loss(ctx.logprobs, b.old_logprobs, ctx.advantages, response,
                                      b.prefix_mask, lo.agg, ctx.norm, target_probs=target_probs,
                                      on_policy_weight=isc.weight * isc.keep, **_luffy_options(cfg))
    return LossTerm(loss, {f"luffy/{k}": v for k, v in metrics.items()} | isc.metrics)


MIXED_PG = LossComponent("luffy_pg", mixed_policy_loss)
MATHS = Maths(losses=(MIXED_PG, ENTROPY, KL), advantage=_luffy_adv)
