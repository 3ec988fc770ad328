"""PPO clipped surrogate (with optional dual clip) and KL estimators.

Shapes: every tensor [B, T]; `mask` is the response (loss) mask. The loss returned is per token,
un-aggregated: the learner aggregates it with `algos.aggregation` under global normalisation.
"""

from __future__ import annotations

import torch

from algos.masked import masked_mean

LOG_RATIO_CLAMP = 20.0


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)), r = exp(clamp(log π_θ − log π_old, ±20)).

    With `dual_clip = c` (> 1), tokens with A < 0 use min(ℓ, −c·A) (Ye et al. 2020, as verl).
    Metrics (masked means, detached): clipfrac (the clipped branch is active), clipfrac_lower (the
    dual clip is active), ppo_kl (mean of log π_old − log π_θ).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip})")
    log_ratio = torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {
        "clipfrac": masked_mean((clipped > unclipped).float(), mask).detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    if dual_clip is not None:
        lower = -advantages * dual_clip
        dual = torch.minimum(loss, lower)
        metrics["clipfrac_lower"] = masked_mean(((loss > lower) & (advantages < 0)).float(), mask).detach()
        loss = torch.where(advantages < 0, dual, loss)
    else:
        metrics["clipfrac_lower"] = torch.zeros(())
    return loss, metrics


KL_ESTIMATORS = ("k1", "abs", "mse", "k3")


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from samples of π_θ.

    k1 (verl "kl"): log π − log π_ref.   abs: |k1|.   mse: ½·k1².
    k3 (verl "low_var_kl", Schulman): exp(log π_ref − log π) − (log π_ref − log π) − 1, log-ratio
    clamped to ±20 and the result to [−10, 10] as in verl.
    """
    d = logprobs - ref_logprobs
    if estimator in ("k1", "kl"):
        return d
    if estimator == "abs":
        return d.abs()
    if estimator == "mse":
        return 0.5 * d.square()
    if estimator in ("k3", "low_var_kl"):
        kl = torch.clamp(ref_logprobs - logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(kl) - kl - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")
