"""PPO clipped surrogate (token- or GSPO sequence-level ratio, optional dual clip) and KL estimators.

Shapes: every tensor [B, T]; `mask` is the response (loss) mask. The loss returned is per token,
un-aggregated: the learner aggregates it with `algos.aggregation` under global normalisation.
"""

from __future__ import annotations

import torch

from algos.masked import masked_mean

LOG_RATIO_CLAMP = 20.0


RATIO_LEVELS = ("token", "sequence")


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token log-ratio [B, T]: sg[log s_i] + log π_θ(y_t) − sg[log π_θ(y_t)], with

        log s_i = clamp(Σ_t (log π_θ − log π_old)·M / Σ_t M, ±20)   (0 for an empty row).

    Its value is log s_i on every token of row i; its gradient is that of log π_θ(y_t), so
    exp(·) = s_{i,t} = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)] has gradient s_i·∇log π_θ(y_t) (Zheng et al.
    2025, "GSPO-token"). With a per-row advantage and seq-mean-token-mean aggregation this is
    GSPO's sequence-level gradient s_i·A_i·(1/|y_i|)·Σ_t ∇log π_θ(y_t).
    """
    m = mask.to(logprobs.dtype)
    diff = torch.where(m > 0, logprobs - old_logprobs, torch.zeros_like(logprobs)).detach()
    seq = diff.sum(-1) / m.sum(-1).clamp_min(1.0)
    seq = torch.clamp(seq, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return seq[:, None] + logprobs - logprobs.detach()


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)) per token.

    ratio_level "token" (default): r = exp(clamp(log π_θ − log π_old, ±20)).
    ratio_level "sequence" (GSPO, Zheng et al. 2025): r = s_{i,t} from `sequence_log_ratio` over the
    row's `mask` tokens — the value s_i is shared by the row, so the clip acts per sequence (a clipped
    row gets no gradient from that side), while A may still vary per token (GSPO-token).
    With `dual_clip = c` (> 1), tokens with A < 0 use min(ℓ, −c·A) (Ye et al. 2020, as verl), on the
    token's own A and the chosen r.
    Metrics (masked means over `mask`, detached): clipfrac (tokens whose clipped branch is active; for
    "sequence" the token-weighted fraction of clipped rows when A is per row), clipfrac_lower (the
    dual clip is active), ppo_kl (mean over tokens of log π_old − log π_θ, clamped to ±20, both levels).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip})")
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown loss.ratio_level {ratio_level!r}; choose one of {RATIO_LEVELS}")
    log_ratio = torch.clamp(logprobs - old_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if ratio_level == "sequence":
        ratio = torch.exp(sequence_log_ratio(logprobs, old_logprobs, mask))
    else:
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


KL_ESTIMATORS = ("k1", "abs", "mse", "k3", "low_var_kl")


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from samples of π_θ, with d = log π − log π_ref.

    k1 (verl "kl"): d.   abs: |d|.   mse: ½·d².
    k3 (Schulman's estimator; PURE-main `use_kl_estimator_k3`): exp(−d) + d − 1, unclamped.
    low_var_kl (verl): k3 with −d clamped to ±20 and the result to [−10, 10].
    Each name means one estimator everywhere (`loss.kl_estimator`, `pure.kl_estimator`).
    """
    d = logprobs - ref_logprobs
    if estimator in ("k1", "kl"):
        return d
    if estimator == "abs":
        return d.abs()
    if estimator == "mse":
        return 0.5 * d.square()
    if estimator == "k3":
        return torch.exp(-d) - 1.0 + d
    if estimator == "low_var_kl":
        kl = torch.clamp(ref_logprobs - logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(kl) - kl - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")
