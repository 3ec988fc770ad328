"""PURE-verl's RLOO on token rewards, the whole of `compute_rloo_outcome_advantage` (the package computes
the same advantage through `algos.pure.maths.pure_advantage` with baseline=verl)."""

from __future__ import annotations

import torch

from algos.masked import whiten
from algos.pure.maths import verl_baseline
from algos.returns import suffix_sum


def verl_rloo_advantage(token_rewards: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor, *,
                        width: int | None = None, do_whiten: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """PURE-verl `compute_rloo_outcome_advantage` with return_aggregate_method "sum" on token rewards
    r [B, T] (the reference's token_level_rewards: VR at the last token + step rewards − β·KL):

        R_t = Σ_{s≥t} r_s·M_s;   R ← (R − b_i)·M with b_i = `verl_baseline(R, M, g, width)` (L = width,
        default T);   A = whiten(R, M)·M when `do_whiten` (adv_norm), else R.
    Returns (advantages, returns), both [B, T].

    Deviations from the reference: "min" aggregation (a running minimum over all columns, padding and
    non-step zeros included, REFERENCE_NOTES §7.8) is not offered — `pure.credit=strict` is the true
    suffix minimum; a singleton group gets b = 0 instead of a division by zero.
    """
    m = mask.to(token_rewards.dtype)
    returns = suffix_sum(token_rewards * m) * m
    returns = (returns - verl_baseline(returns, m, group_index, width)[:, None]) * m
    adv = whiten(returns, m) * m if do_whiten else returns
    return adv, returns
