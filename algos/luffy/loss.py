"""LUFFY's mixed on/off-policy token loss (REFERENCE_NOTES §4.4; ALGORITHMS.md "LUFFY").

Shapes: every tensor [B, T]. `response_mask` M is 1 on response tokens (demonstration and generated);
`prefix_mask` P is True on off-policy demonstration tokens. Notation: p = exp(log π_θ),
Δ = log π_θ − log π_old (π_old = π_prox, the learner's log-probs at the start of the step).

  on-policy tokens (M·¬P):  ℓ_on  = −A·ρ_on, ρ_on = g(Δ) from `on_policy_reshape`, then (unless
                            `remove_clip`) max(ℓ_on, −A·clip(ρ_on, 1 − ε_low, max(clip_upper_bound, 1 + ε_high)))
  off-policy tokens (M·P):  ℓ_off = −A·f(p) from `off_policy_reshape` (the teacher's probability is
                            taken as 1), optionally clamped to [off_min_clip, off_max_clip];
                            with target probabilities q: f = p/(q + 1e-6).
  all_max_clip c:           tokens with p > c are dropped (loss and mask 0), on- and off-policy alike.

Clip scope. The only PPO clip is the on-policy one, and only `remove_clip` removes it (the reference's
`loss_remove_clip`, which LUFFY's script sets). Demonstration tokens are never PPO-clipped: the
reference's `off_policy_cliprange` / `use_off_policy_clip` / `off_abs_cliprange` are dead config. That
is where the reference conflates the two: its one "remove clip" switch, meant for the unclipped
policy-shaping objective on demonstrations, is the switch that drops the on-policy PPO clip
(`compute_token_on_off_policy_loss`, and `compute_policy_loss` on the plain path). Here the off-policy
options (off_policy_reshape and its weight/exponent, off_max_clip, off_min_clip, target_probs) only
shape f on prefix tokens, and the per-token loss picks ℓ_off or ℓ_on with where(prefix) — no
off-policy option reads or changes ℓ_on (a test varies each of them and compares ℓ_on). The
reference's −1 "off" sentinel for off_max_clip / off_min_clip / all_max_clip is not one here (null is
off; the config rejects all_max_clip ≤ 0, which would drop every token).

Reshapes (w = reshape weight, e = pow exponent, γ any positive float):
  name          on-policy ρ_on(Δ)                       off-policy f(p)
  no_reshape    exp(Δ)                                  p
  logp          Δ                                       w·log p
  p_logp        exp(Δ) + w·Δ                            p + w·log p
  square_root   exp(Δ)^½                                √p
  pow           exp(Δ)^e                                p^e
  p_div_p_γ     [p/(p+γ)] / [p_old/(p_old+γ)]           p/(p+γ)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algos.masked import masked_mean
from algos.ppo import LOG_RATIO_CLAMP


def _mmean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean that ignores non-finite values outside the mask (0 for an empty mask)."""
    return masked_mean(torch.where(mask > 0, x, torch.zeros_like(x)), mask)


RESHAPES = ("no_reshape", "logp", "p_logp", "square_root", "pow", "p_div_p_<gamma>")
TARGET_PROB_EPS = 1e-6


def parse_reshape(name: str) -> tuple[str, float | None]:
    """("p_div_p", γ) for "p_div_p_<γ>" (any float γ > 0), (name, None) for the other reshapes.

    Deviations from the reference: any γ > 0 is accepted (the reference hard-codes a few); unknown names
    raise ValueError with the list of choices.
    """
    if name.startswith("p_div_p_"):
        try:
            gamma = float(name[len("p_div_p_"):])
        except ValueError:
            gamma = float("nan")
        if not gamma > 0:
            raise ValueError(f"reshape {name!r}: p_div_p_<γ> needs a positive float γ")
        return "p_div_p", gamma
    if name in ("no_reshape", "logp", "p_logp", "square_root", "pow"):
        return name, None
    raise ValueError(f"unknown reshape {name!r}; choose one of {RESHAPES}")


def on_policy_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, reshape: str = "no_reshape",
                    weight: float = 0.1, pow_exp: float = 0.5) -> torch.Tensor:
    """ρ_on [B, T] (table in the module docstring). Gradient flows through `logprobs` only.

    Deviations from the reference: Δ is clamped to ±20 before exp (as our PPO loss), the reference
    exponentiates it raw; identical whenever |Δ| < 20. p_div_p_γ accepts any γ > 0 (the reference
    hard-codes γ ∈ {0.1, 0.5} for the on-policy side).
    """
    kind, gamma = parse_reshape(reshape)
    old = old_logprobs.detach()
    delta = torch.clamp(logprobs - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "logp":
        return delta
    if kind == "p_div_p":
        p, p_old = torch.exp(logprobs), torch.exp(old)
        return (p / (p + gamma)) / (p_old / (p_old + gamma))
    ratio = torch.exp(delta)
    if kind == "no_reshape":
        return ratio
    if kind == "p_logp":
        return ratio + weight * delta
    if kind == "square_root":
        return torch.sqrt(ratio)
    return torch.pow(ratio, pow_exp)  # pow


def off_policy_shape(logprobs: torch.Tensor, reshape: str = "p_div_p_0.1", weight: float = 0.1,
                     pow_exp: float = 0.5) -> torch.Tensor:
    """f(p) [B, T] for demonstration tokens (table in the module docstring), p = exp(log π_θ).

    Deviations from the reference: p_div_p_γ accepts any γ > 0 (the reference hard-codes 0.1, 0.3, 0.5).
    """
    kind, gamma = parse_reshape(reshape)
    p = torch.exp(logprobs)
    if kind == "no_reshape":
        return p
    if kind == "logp":
        return weight * logprobs
    if kind == "p_logp":
        return p + weight * logprobs
    if kind == "square_root":
        return torch.sqrt(p)
    if kind == "pow":
        return torch.pow(p, pow_exp)
    return p / (p + gamma)  # p_div_p


@dataclass(frozen=True)
class LuffyTokenLoss:
    loss: torch.Tensor  # [B, T] per-token loss (off on prefix tokens, on elsewhere), 0 where dropped
    mask: torch.Tensor  # [B, T] float response mask after all_max_clip (the reference's loss mask)
    metrics: dict[str, torch.Tensor]  # detached scalars (names as the reference's diagnostics)


def luffy_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    prefix_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_upper_bound: float = 1.0,
    remove_clip: bool = False,
    dual_clip: float | None = None,
    on_policy_reshape: str = "no_reshape",
    on_policy_reshape_weight: float = 0.1,
    on_policy_reshape_pow_exp: float = 0.5,
    off_policy_reshape: str = "p_div_p_0.1",
    off_policy_reshape_weight: float = 0.1,
    off_policy_reshape_pow_exp: float = 0.5,
    off_max_clip: float | None = None,
    off_min_clip: float | None = None,
    all_max_clip: float | None = None,
    target_probs: torch.Tensor | None = None,
    on_policy_weight: torch.Tensor | None = None,
) -> LuffyTokenLoss:
    """Per-token LUFFY loss [B, T] and the reference's diagnostics (module docstring for the maths).

    `on_policy_weight` [B, T] (detached) multiplies ℓ_on: the behaviour importance correction
    (w·keep from `algos.importance`) in our asynchronous setting; None = 1 (the reference).
    `dual_clip` c (optional, not in the reference): for A < 0, ℓ_on = min(ℓ_on, −c·A) after the clip.

    Metrics (all detached; masked means, 0 when the mask is empty): off_pg_loss / on_pg_loss (over
    prefix / non-prefix response tokens), on_pg_clipfrac and ppo_kl (over all response tokens, as the
    reference), off_pg_clipfrac (always 0: no clip on demonstration tokens), off_policy_prob (mean p on
    prefix tokens), on_policy_prob (mean p_old on the others), off_ratio_mean, off_ratio_max_clip_frac,
    off_ratio_min_clip_frac (over prefix tokens, after clamping).

    on_pg_clipfrac exactly (as the reference, so it matches its vectors): numerator = response tokens
    (M, before all_max_clip) where −A·clip(ρ_on, 1 − ε_low, max(clip_upper_bound, 1 + ε_high)) > −A·ρ_on
    strictly, ρ_on the on-policy (reshaped) ratio evaluated on *every* response token — demonstration
    tokens included, where it is π_θ/π_old of the learner's own log-probs; denominator = Σ M over all
    response tokens, demonstration tokens included. So it is not the clipped share of generated tokens:
    on a batch that is mostly demonstration it is diluted (and demonstration tokens can count as
    clipped although their loss ℓ_off has no clip). It ignores the dual clip and the IS weights, and is 0
    with `remove_clip`. (`luffy/...` in the logs; the IS clip fraction is `is/clip_frac`.)

    Deviations from the reference:
      - ℓ_on is multiplied by `on_policy_weight` (IS correction; the reference has no behaviour policy).
      - the ε of the lower and upper clip may differ (clip_low, clip_high); the reference has one ε.
      - `dual_clip` is an addition; off by default.
      - the reference computes the NaN → 0 fallback of off_pg_loss with `is True` on a tensor, which
        never fires for on_pg_loss; here every masked mean of an empty mask is 0.
    """
    m = response_mask.to(logprobs.dtype)
    pre = prefix_mask.to(logprobs.dtype) * m
    on = m - pre
    adv = advantages.detach()

    ratio = on_policy_ratio(logprobs, old_logprobs, on_policy_reshape, on_policy_reshape_weight,
                            on_policy_reshape_pow_exp)
    on_loss = -adv * ratio
    if remove_clip:
        on_clipfrac = torch.zeros((), dtype=logprobs.dtype)
    else:
        upper = max(clip_upper_bound, 1.0 + clip_high)
        clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, upper)
        on_clipfrac = _mmean((clipped > on_loss).to(logprobs.dtype), m)
        on_loss = torch.maximum(on_loss, clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (got {dual_clip})")
        on_loss = torch.where(adv < 0, torch.minimum(on_loss, -dual_clip * adv), on_loss)
    if on_policy_weight is not None:
        on_loss = on_loss * on_policy_weight.detach()

    if target_probs is None:
        f = off_policy_shape(logprobs, off_policy_reshape, off_policy_reshape_weight, off_policy_reshape_pow_exp)
    else:
        if target_probs.shape != logprobs.shape:
            raise ValueError(f"target_probs must have shape {tuple(logprobs.shape)}, got {tuple(target_probs.shape)}")
        f = torch.exp(logprobs) / (target_probs.detach().to(logprobs.dtype) + TARGET_PROB_EPS)
    zero = torch.zeros((), dtype=logprobs.dtype)
    max_frac = min_frac = zero
    if off_max_clip is not None:
        f = torch.clamp(f, max=off_max_clip)
        max_frac = _mmean((f == off_max_clip).to(logprobs.dtype), pre)
    if off_min_clip is not None:
        f = torch.clamp(f, min=off_min_clip)
        min_frac = _mmean((f == off_min_clip).to(logprobs.dtype), pre)
    off_loss = -adv * f

    # where() rather than a blend: a non-finite value on the unused side (e.g. log p of a padded
    # token) must not leak into the other.
    tok = torch.where(pre > 0, off_loss, on_loss)
    mask = m
    if all_max_clip is not None:
        mask = m * (torch.exp(logprobs.detach()) <= all_max_clip).to(m.dtype)
    tok = torch.where(mask > 0, tok, torch.zeros_like(tok))

    with torch.no_grad():
        metrics = {
            "off_pg_loss": _mmean(off_loss, pre),
            "on_pg_loss": _mmean(on_loss, on),
            "off_pg_clipfrac": zero,
            "on_pg_clipfrac": on_clipfrac,
            "ppo_kl": _mmean(old_logprobs - logprobs, m),
            "off_policy_prob": _mmean(torch.exp(logprobs), pre),
            "on_policy_prob": _mmean(torch.exp(old_logprobs), on),
            "off_ratio_mean": _mmean(f, pre),
            "off_ratio_max_clip_frac": max_frac,
            "off_ratio_min_clip_frac": min_frac,
        }
    return LuffyTokenLoss(loss=tok, mask=mask, metrics={k: v.detach() for k, v in metrics.items()})
