"""Importance correction for asynchronous (stale) rollouts: μ (vLLM sampler) vs π_prox (learner).

Shapes: [B, T]. `mask` must select *on-policy* response tokens only (demonstration tokens have no μ).
The weight w = π_prox/μ = exp(log π_prox − log μ) corrects for the policy lag and for sampler/learner
numerical mismatch. Modes (ALGORITHMS.md "Asynchrony"):

  none       w = 1.
  tis        truncated IS: the per-token policy-gradient loss is multiplied by min(w, C), C = 2.
  mask       tokens with w ∉ [C_min, C_max] are dropped (loss 0), the rest keep weight 1.
  decoupled  AReaL's decoupled PPO: the PPO clip is taken on π_θ/π_prox and the loss is weighted by w;
             tokens with w > C are dropped (AReaL's behaviour-weight cap) instead of truncated.

Dropped tokens still count in the loss normaliser (so dropping never rescales the other tokens).
Metrics: weight mean/max (of the raw w), clip_frac (tokens truncated or dropped), ESS = (Σw)²/(N·Σw²)
of the raw w, and the mismatch KL(μ ‖ π_prox) via the k3 estimator exp(d) − d − 1, d = log π_prox − log μ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algos.masked import masked_mean

IS_MODES = ("tis", "mask", "decoupled", "none")


@dataclass(frozen=True)
class ISCorrection:
    weight: torch.Tensor  # [B, T] multiplier for the per-token pg loss (detached)
    keep: torch.Tensor  # [B, T] float, 0 where the token is dropped (applied on top of the loss mask)
    metrics: dict[str, torch.Tensor]


def importance_correction(
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "tis",
    cap: float = 2.0,
    cap_min: float = 0.5,
    cap_max: float = 5.0,
) -> ISCorrection:
    if mode not in IS_MODES:
        raise ValueError(f"unknown is_correction {mode!r}; choose one of {IS_MODES}")
    m = mask.to(prox_logprobs.dtype)
    d = (prox_logprobs - behav_logprobs).detach().clamp(-20.0, 20.0)
    raw = torch.exp(d)
    ones = torch.ones_like(raw)
    if mode == "none":
        weight, keep, clipped = ones, ones, torch.zeros_like(raw)
    elif mode == "tis":
        weight, keep = torch.clamp(raw, max=cap), ones
        clipped = (raw > cap).to(raw.dtype)
    elif mode == "mask":
        inside = ((raw >= cap_min) & (raw <= cap_max)).to(raw.dtype)
        weight, keep, clipped = ones, inside, 1.0 - inside
    else:  # decoupled
        inside = (raw <= cap).to(raw.dtype)
        weight, keep, clipped = raw * inside, inside, 1.0 - inside
    n = m.sum()
    sw, sw2 = (raw * m).sum(), (raw.square() * m).sum()
    metrics = {
        "is/weight_mean": masked_mean(raw, m),
        "is/weight_max": (raw * m).max() if n > 0 else torch.zeros(()),
        "is/clip_frac": masked_mean(clipped, m),
        "is/ess": (sw * sw / (n * sw2)) if n > 0 else torch.ones(()),
        "mismatch/kl": masked_mean(torch.exp(d) - d - 1.0, m),
    }
    return ISCorrection(weight=weight, keep=keep, metrics=metrics)
