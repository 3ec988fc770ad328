"""Group baselines on scalar per-row scores (vectorised over groups).

Shapes: `scores` [B] float, `group_index` [B] int64 with values in [0, G) naming the group (prompt) of
each row — rows of a group need not be contiguous. All functions return advantages [B].

Estimators (ALGORITHMS.md "Shared pieces"):
  grpo        (s_i − mean_g)/(std_g + eps), std unbiased; a singleton group uses mean 0, std 1.
              `use_std=False` gives s_i − mean_g (Dr.GRPO).
  rloo        s_i − mean_{j≠i} s_j; a singleton row is left unchanged.
  grpo_split  LUFFY: mean/std from the group's on-policy rows only, applied to every row of the group;
              std 0 → 1; a single on-policy row → mean 0, std 1; no on-policy row → ValueError.
  reinforce   s_i.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _check(scores: torch.Tensor, group_index: torch.Tensor) -> int:
    if scores.dim() != 1 or group_index.shape != scores.shape:
        raise ValueError(f"scores and group_index must both be [B]; got {tuple(scores.shape)} and "
                         f"{tuple(group_index.shape)}")
    if scores.numel() == 0:
        return 0
    if group_index.min() < 0:
        raise ValueError("group_index must be non-negative")
    return int(group_index.max()) + 1


def group_sum(values: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group sum: [B] -> [G]."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, group_index, values)


def _mean_std(scores: torch.Tensor, group_index: torch.Tensor, weight: torch.Tensor, num_groups: int):
    """Per-row (mean, unbiased std, count) of the weighted rows of its group."""
    count = group_sum(weight, group_index, num_groups)
    mean = group_sum(scores * weight, group_index, num_groups) / count.clamp_min(1.0)
    dev2 = (scores - mean[group_index]) ** 2 * weight
    var = group_sum(dev2, group_index, num_groups) / (count - 1.0).clamp_min(1.0)
    return mean[group_index], var.sqrt()[group_index], count[group_index]


def grpo(scores: torch.Tensor, group_index: torch.Tensor, use_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    g = _check(scores, group_index)
    mean, std, count = _mean_std(scores, group_index, torch.ones_like(scores), g)
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return (scores - mean) / (std + eps) if use_std else scores - mean


def rloo(scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    g = _check(scores, group_index)
    count = group_sum(torch.ones_like(scores), group_index, g)[group_index]
    total = group_sum(scores, group_index, g)[group_index]
    loo = scores - (total - scores) / (count - 1.0).clamp_min(1.0)
    return torch.where(count > 1, loo, scores)


def grpo_split(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    on_policy: torch.Tensor,
    use_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    g = _check(scores, group_index)
    weight = on_policy.to(scores.dtype)
    mean, std, count = _mean_std(scores, group_index, weight, g)
    if (count < 1).any():
        bad = sorted(set(group_index[count < 1].tolist()))
        raise ValueError(f"grpo_split: group(s) {bad[:5]} have no on-policy row, so there is no baseline; "
                         "keep at least one on-policy sample per group (luffy.n_prefix < n)")
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single | (std == 0), torch.ones_like(std), std)
    return (scores - mean) / (std + eps) if use_std else scores - mean


def reinforce(scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    _check(scores, group_index)
    return scores.clone()


BASELINES: dict[str, Callable[..., torch.Tensor]] = {
    "grpo": grpo,
    "dr_grpo": lambda s, g, **kw: grpo(s, g, use_std=False, **kw),
    "rloo": rloo,
    "grpo_split": grpo_split,
    "reinforce": reinforce,
}


def compute_baseline(name: str, scores: torch.Tensor, group_index: torch.Tensor, **kwargs) -> torch.Tensor:
    """Dispatch by name; unknown names raise with the list of known estimators."""
    try:
        fn = BASELINES[name]
    except KeyError:
        raise ValueError(f"unknown group baseline {name!r}; choose one of {sorted(BASELINES)}") from None
    return fn(scores, group_index, **kwargs)
