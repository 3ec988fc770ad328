"""PRIME reference rules the package leaves to others: the group filter and oversample-then-downsample
(the buffer's `buffer.filter=accuracy_window` is the live rule, `buffer/core.py`), and the implicit q
(computed inside the learner's PRM provider, `learner.prm.prime`)."""

from __future__ import annotations

import torch

from algos import baselines


def accuracy_group_filter(
    acc: torch.Tensor,
    group_index: torch.Tensor,
    lo: float = 0.2,
    hi: float = 0.8,
    *,
    filter_accuracy: bool = True,
    response_mask: torch.Tensor | None = None,
    max_response_length: int | None = None,
) -> torch.Tensor:
    """Rows to keep [B] bool; whole groups are kept or dropped.

    A group is kept iff lo ≤ mean_g(acc) ≤ hi (inclusive, mean in float64; skipped when
    `filter_accuracy=False`) and, when `max_response_length` is given (PRIME-orig `filter_truncated`),
    no row of the group has valid length Σ_t response_mask ≥ max_response_length.

    Deviations from the reference: PRIME-orig keeps sampling until the batch is full and buffers surplus
    prompts; that policy belongs to the buffer — this function only decides which groups pass.
    """
    if acc.dim() != 1 or group_index.shape != acc.shape:
        raise ValueError("acc and group_index must both be [B]")
    keep = torch.ones_like(acc, dtype=torch.bool)
    if acc.numel() == 0:
        return keep
    g = int(group_index.max()) + 1
    if filter_accuracy:
        count = baselines.group_sum(torch.ones_like(acc, dtype=torch.float64), group_index, g)
        mean = baselines.group_sum(acc.double(), group_index, g) / count.clamp_min(1.0)
        keep &= ((mean >= lo) & (mean <= hi))[group_index]
    if max_response_length is not None:
        if response_mask is None:
            raise ValueError("the truncation filter needs response_mask")
        truncated = (response_mask.sum(-1) >= max_response_length).double()
        keep &= (baselines.group_sum(truncated, group_index, g) == 0)[group_index]
    return keep


def downsample_groups(group_pass: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Indices [num_groups] int64 of the groups to train on, passing groups first (mirrors PRIME-verl
    `filter_and_downsample`, REFERENCE_NOTES §2.1 step 3 and §7.6).

    group_pass [G] bool: group g passes the filters, e.g. `accuracy_group_filter(...)` at g's first row
    (PRIME-verl's truncation filter, max valid length ≥ max_response_length − 1, is
    `max_response_length=L − 1` there). With G = oversample_factor × B candidates and num_groups = B the
    result is: every passing group in index order, then failing groups in index order, cut to exactly
    num_groups — so failing groups fill the batch when fewer than B pass. Row indices of group g with
    contiguous groups of n: g·n … g·n + n − 1 (the reference reorders rows that way).

    Deviations from the reference: the order is stable (the reference's `argsort(mask, descending=True)`
    does not guarantee which passing/failing groups come first among equals). In this system the
    function is not wired in: the buffer applies the accuracy filter (`buffer.filter=accuracy_window`)
    and the learner pulls `learner.batch_prompts` passing groups, so the refill happens by construction
    (the buffer waits for more passing groups; failing groups never fill a batch).
    """
    if group_pass.dim() != 1:
        raise ValueError(f"group_pass must be [G] (got shape {tuple(group_pass.shape)})")
    g = group_pass.shape[0]
    if not 0 <= num_groups <= g:
        raise ValueError(f"cannot keep {num_groups} groups out of {g} candidates")
    passing = group_pass.bool()
    order = torch.cat([torch.nonzero(passing).flatten(), torch.nonzero(~passing).flatten()])
    return order[:num_groups]


def implicit_q(prm_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q_t = log π_φ(y_t) − log π_ref(y_t) on response tokens, 0 elsewhere: [B, T] -> [B, T].

    Deviations from the reference: none in value. PRIME-orig keeps q unmasked (its padded log-probs
    are 0 in both models, so the values agree); here q is zeroed explicitly outside the mask.
    """
    if prm_logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"PRM and reference log-probs differ in shape: {tuple(prm_logprobs.shape)} vs "
                         f"{tuple(ref_logprobs.shape)}")
    return (prm_logprobs - ref_logprobs) * mask.to(prm_logprobs.dtype)
