"""AdamW, the learning-rate schedule, gradient clipping and the non-finite-gradient rule.

The schedule is a pure function of the optimiser step (`lr_at`), written into the param groups before
every step, so resuming needs only the step counter: no scheduler object state to pickle.
Gradient norms are computed over the sharded (DTensor) gradients, i.e. the global norm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

SCHEDULES = ("constant", "cosine", "linear")


def lr_at(step: int, *, peak: float, warmup: int, total: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Learning rate of optimiser step `step` (0-based).

    Warm-up: peak·(step+1)/warmup for step < warmup. Then constant: peak; linear and cosine decay from
    peak to min_ratio·peak at step `total` (progress p = (step − warmup)/(total − warmup), clamped to 1):
    linear = peak·(1 − (1−min_ratio)·p), cosine = peak·(min_ratio + (1−min_ratio)·½(1 + cos πp)).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr_schedule {schedule!r}; choose one of {SCHEDULES}")
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant":
        return peak
    p = min(max(step - warmup, 0) / max(total - warmup, 1), 1.0)
    if schedule == "linear":
        return peak * (1.0 - (1.0 - min_ratio) * p)
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p)))


def make_adamw(params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float],
               weight_decay: float) -> torch.optim.AdamW:
    # foreach=True: torch picks the per-tensor loop for DTensor (FSDP2) parameters unless asked.
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, betas=tuple(betas),
                             weight_decay=weight_decay, eps=1e-8, foreach=True)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def grad_norm(params: list[torch.nn.Parameter]) -> float:
    """Global L2 norm of the gradients (over all shards and ranks); inf/nan pass through."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def clip_(params: list[torch.nn.Parameter], total_norm: float, max_norm: float) -> None:
    """Scale gradients by min(1, max_norm/(total_norm + 1e-6)) in place (torch's clip rule)."""
    coef = max_norm / (total_norm + 1e-6)
    if coef < 1.0:
        grads = [p.grad for p in params if p.grad is not None]
        torch._foreach_mul_(grads, coef)


def optimizer_step(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], *, max_norm: float | None,
                   skip_nonfinite: bool, what: str) -> tuple[float, bool]:
    """Clip (unless max_norm is None) and step. Returns (grad norm before clipping, stepped).

    A non-finite norm skips the step when `skip_nonfinite`, else raises FloatingPointError (stepping
    would write NaN into every weight). Gradients are zeroed either way.
    """
    norm = grad_norm(params)
    finite = math.isfinite(norm)
    if not finite and not skip_nonfinite:
        opt.zero_grad(set_to_none=True)
        raise FloatingPointError(f"{what}: non-finite gradient norm ({norm}); the step was not applied. "
                                 "Lower the learning rate or check the inputs (rewards, log-probs).")
    if finite:
        if max_norm is not None:
            clip_(params, norm, max_norm)
        opt.step()
    opt.zero_grad(set_to_none=True)
    return norm, finite
