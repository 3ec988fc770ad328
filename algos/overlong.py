"""DAPO overlong handling (Yu et al. 2025, "DAPO", §3.4): overlong filtering and soft overlong punishment.

Shapes: `mask` [B, T] response mask, `truncated` [B] bool (the sample hit the generation limit before
an eos; `StepBatch.truncated`, from `Sample.truncated`), `lengths` [B] response lengths |y| in tokens.

  overlong filtering (`loss.overlong_filter`): truncated rows leave the loss — their tokens are taken
      out of the loss mask of every loss term (`loss_mask`, used by the PPO-clip, entropy and KL
      terms of `algos.policy_gradient` and by LUFFY's mixed loss). Advantages are still computed with
      them (a truncated row's reward stays in its group's baseline), as DAPO.
  soft overlong punishment (`loss.overlong_cache_tokens` = L_cache > 0), L_max = the generation limit
      `rollout.max_response_tokens`, f = `loss.overlong_penalty_factor` (default 1):
          R_length(y) = 0                                  if |y| ≤ L_max − L_cache
                      = f·((L_max − L_cache) − |y|)/L_cache  if L_max − L_cache < |y| ≤ L_max
                      = −f                                 if |y| > L_max
      added to the outcome reward before the advantage (`shaped_rewards`), so every group baseline
      sees the penalised reward.

The penalty mirrors DAPO's paper formula; f mirrors verl's DAPO recipe `overlong_buffer.penalty_factor`
(the recipe computes min(−f·(|y| − (L_max − L_cache))/L_cache, 0), equal to the above for |y| ≤ L_max).
Deviations from the reference: |y| = Σ_t M over the whole response, so a LUFFY row counts its
demonstration prefix (the prefix takes its share of the same response budget).
"""

from __future__ import annotations

from typing import Any

import torch

from algos.masked import masked_mean


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int, factor: float = 1.0) -> torch.Tensor:
    """Soft overlong punishment R_length [B] (float32) of response lengths [B] (formula in the module doc).

    `cache` = 0 gives all zeros. ValueError unless 0 ≤ cache ≤ max_len (the key is named in the message).
    """
    if not 0 <= cache <= max_len:
        raise ValueError(f"loss.overlong_cache_tokens={cache} must lie in [0, rollout.max_response_tokens="
                         f"{max_len}] — lower loss.overlong_cache_tokens")
    y = lengths.to(torch.float32)
    if cache == 0:
        return torch.zeros_like(y)
    soft = max_len - cache
    ramp = (soft - y) / cache
    out = torch.where(y <= soft, torch.zeros_like(y), torch.where(y <= max_len, ramp, torch.full_like(y, -1.0)))
    return factor * out


def filter_truncated(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """The mask [B, T] with the rows of truncated samples ([B] bool) zeroed (DAPO overlong filtering)."""
    return mask * (~truncated.bool()).to(mask.dtype)[:, None]


def loss_mask(batch: Any, mask: torch.Tensor, cfg: Any) -> torch.Tensor:
    """`mask` [b, T] (a loss mask of `batch`'s rows) with truncated rows removed when
    `cfg.loss.overlong_filter`; unchanged otherwise. `batch.truncated` [b] bool (None = none truncated).

    Normalisers: under a `LossNorm` counted over this filtered mask, the filtered rows leave the
    normaliser too (DAPO: token-mean over the kept samples' tokens). The learner's global `LossNorm`
    must therefore count `loss_mask(batch, batch.response_mask, cfg)`; if it counts the plain response
    mask, the filtered tokens stay in the denominator (as tokens dropped by the IS correction do).
    """
    truncated = getattr(batch, "truncated", None)
    if not cfg.loss.overlong_filter or truncated is None:
        return mask
    return filter_truncated(mask, truncated.to(mask.device))


def shaped_rewards(batch: Any, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Outcome rewards [B] (float32) plus the soft overlong punishment, and its metrics.

    Reads batch.rewards [B], batch.response_mask [B, T] (|y| = Σ_t M) and batch.truncated [B];
    cfg.loss.overlong_cache_tokens (0 = off, rewards returned unchanged), overlong_penalty_factor and
    cfg.rollout.max_response_tokens (L_max). Metrics: overlong/penalty_mean (mean R_length over rows),
    overlong/penalised_frac (rows with R_length < 0), overlong/truncated_frac.
    """
    rewards = batch.rewards.float()
    lc = cfg.loss
    truncated = getattr(batch, "truncated", None)
    metrics: dict[str, torch.Tensor] = {}
    if truncated is not None and truncated.numel():
        metrics["overlong/truncated_frac"] = truncated.float().mean()
    if lc.overlong_cache_tokens == 0:
        return rewards, metrics
    lengths = batch.response_mask.sum(-1)
    pen = overlong_penalty(lengths, cfg.rollout.max_response_tokens, lc.overlong_cache_tokens,
                           lc.overlong_penalty_factor).to(rewards.device)
    ones = torch.ones_like(pen)
    metrics |= {"overlong/penalty_mean": masked_mean(pen, ones),
                "overlong/penalised_frac": masked_mean((pen < 0).float(), ones)}
    return rewards + pen, metrics
