"""Token-level returns and small per-token helpers.

Shapes: `rewards`, `mask` [B, T].
"""

from __future__ import annotations

import torch


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """R_t = Σ_{k≥t} γ^{k−t} r_k·M_k, computed right-to-left; padding positions hold the running value
    of masked tokens after them (0 for right padding)."""
    r = rewards * mask.to(rewards.dtype)
    if gamma == 1.0:
        return suffix_sum(r)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return out


def suffix_sum(x: torch.Tensor) -> torch.Tensor:
    """Undiscounted right-to-left cumulative sum along the last dim (vectorised)."""
    return x.flip(-1).cumsum(-1).flip(-1)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last masked token per row ([B] int64); −1 for an empty row."""
    t = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), t, torch.full_like(t, -1)).max(dim=1).values


def place_at_last_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] scalars -> [B, T] with the value at each row's last response token (empty rows stay 0)."""
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    idx = last_token_index(mask)
    rows = torch.nonzero(idx >= 0).squeeze(-1)
    out[rows, idx[rows]] = values[rows]
    return out
