"""Masked reductions shared by every algorithm.

Conventions (all of `algos/`): B rows (responses), T padded response width, `mask` [B, T] is 1 on real
response tokens and 0 on padding. Masks may be bool or float; they are cast to the value dtype.
"""

from __future__ import annotations

import torch


def _as(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(dtype=like.dtype)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    m = _as(mask, x)
    return (x * m).sum() if dim is None else (x * m).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·M / Σ M. An all-zero mask gives 0 (not NaN): the caller decides whether that is an error."""
    m = _as(mask, x)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(x, m, dim) / count.clamp_min(1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Masked variance over all masked entries, with Bessel's correction when `unbiased`."""
    m = _as(mask, x)
    count = m.sum()
    mean = masked_sum(x, m) / count
    var = masked_sum((x - mean) ** 2, m) / count
    if unbiased:
        if count <= 1:
            raise ValueError(f"masked_var: need at least 2 masked entries for the unbiased variance, got {int(count)}")
        var = var * count / (count - 1)
    return var


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x − μ)/sqrt(var + eps) with μ, var (Bessel) over the masked entries of the whole batch.

    As verl's `masked_whiten`, padding positions are transformed too (not re-zeroed); losses mask them.
    Raises ValueError when fewer than two entries are masked (the variance is undefined).
    """
    m = _as(mask, x)
    mean = masked_sum(x, m) / m.sum().clamp_min(1.0)
    var = masked_var(x, m, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean
