"""PRIME's implicit process reward model (PRM): rewards from log-probs, normalisation, PRM loss, metrics.

Pure functions used by PRIME's advantage (`algos.prime`) and by the learner's implicit-PRM provider,
which holds π_φ (the PRM, a causal LM) and π_ref, computes per-token log-probs, and trains π_φ with
`prm_ce_loss` on its own optimiser.

Shapes: B rows, T padded response width; `mask` [B, T] (bool or 0/1) marks response tokens. Every
[B, T] output is 0 where the mask is 0 unless a docstring says otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from algos.returns import last_token_index, suffix_sum

GRANULARITIES = ("token", "whole")
NORMS = ("batch_norm", "batch_norm_local", "none")


def _mask_like(mask: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(x)
    if mask.shape != x.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values {tuple(x.shape)}")
    return mask.to(x.dtype)


def implicit_q(prm_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q_t = log π_φ(y_t) − log π_ref(y_t) on response tokens, 0 elsewhere: [B, T] -> [B, T].

    Deviations from the reference: none in value. PRIME-orig keeps q unmasked (its padded log-probs
    are 0 in both models, so the values agree); here q is zeroed explicitly outside the mask.
    """
    if prm_logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"PRM and reference log-probs differ in shape: {tuple(prm_logprobs.shape)} vs "
                         f"{tuple(ref_logprobs.shape)}")
    return (prm_logprobs - ref_logprobs) * _mask_like(mask, prm_logprobs)


def implicit_process_reward(
    q: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.05,
    raw_q: bool = False,
    granularity: str = "token",
) -> torch.Tensor:
    """Process reward r [B, T] from q [B, T].

    r_t = c·q_t·M_t with c = β (paper, PRIME-verl, default) or c = 1 (`raw_q=True`, PRIME-orig).
    granularity `token`: every response token carries its own reward; `whole`: the row's total
    c·Σ_t q_t M_t sits at its last response token (empty rows stay 0).

    Deviations from the reference: PRIME-verl's `whole` granularity crashes (shape error) and its
    `token` granularity drops the last token's reward; both follow PRIME-orig here.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown prime granularity {granularity!r}; choose one of {GRANULARITIES}")
    m = _mask_like(mask, q)
    r = q * m * (1.0 if raw_q else beta)
    if granularity == "token":
        return r
    out = torch.zeros_like(r)
    idx = last_token_index(m)
    rows = torch.nonzero(idx >= 0).squeeze(-1)
    out[rows, idx[rows]] = r.sum(-1)[rows]
    return out


def process_reward_scale(r: torch.Tensor, mask: torch.Tensor | None = None, norm: str = "batch_norm",
                         num_shards: int = 1, eps: float = 1e-6) -> torch.Tensor:
    """Per-row divisor [B] of the `prime.norm` normalisation of r [B, T].

    batch_norm        max_{i,t} |Σ_{k≥t} r_{i,k} M_{i,k}| + eps over all rows given (the global batch).
    batch_norm_local  the same max taken within each of `num_shards` contiguous row shards
                      (`torch.tensor_split` of the rows; with B divisible by the shard count these are
                      the reference's equal per-rank chunks), reproducing the reference's rank-local max.
    none              1.

    Deviations from the reference: the default uses the global batch (the reference's rank-local max
    is the option `batch_norm_local`). An all-zero batch gives divisor eps (the rewards stay 0).
    """
    if norm not in NORMS:
        raise ValueError(f"unknown prime norm {norm!r}; choose one of {NORMS}")
    b = r.shape[0]
    if norm == "none":
        return torch.ones(b, dtype=r.dtype, device=r.device)
    ret = suffix_sum(r * _mask_like(mask, r)).abs()
    if b == 0:
        return torch.ones(0, dtype=r.dtype, device=r.device)
    if norm == "batch_norm":
        return (ret.max() + eps).expand(b).clone()
    if num_shards < 1:
        raise ValueError(f"norm_shards must be >= 1 (got {num_shards})")
    out = torch.empty(b, dtype=r.dtype, device=r.device)
    for rows in torch.tensor_split(torch.arange(b, device=r.device), num_shards):
        if rows.numel():
            out[rows] = ret[rows].max() + eps
    return out


def normalize_process_reward(r: torch.Tensor, mask: torch.Tensor | None = None, norm: str = "batch_norm",
                             num_shards: int = 1, eps: float = 1e-6) -> torch.Tensor:
    """r / process_reward_scale(r, ...) (see there): [B, T] -> [B, T]; masked-out entries become 0."""
    scale = process_reward_scale(r, mask, norm, num_shards, eps)
    return r * _mask_like(mask, r) / scale[:, None]


def prm_ce_loss(q: torch.Tensor, acc: torch.Tensor, mask: torch.Tensor, beta: float = 0.05,
                reduction: str = "mean") -> torch.Tensor:
    """PRM cross-entropy loss: BCE(σ(β Σ_t q_t M_t), acc_i), `mean` over rows (`sum`, `none` for the
    learner's global normalisation). q [B, T] carries the gradient of log π_φ; acc [B] in [0, 1].

    Deviations from the reference: computed from logits (`binary_cross_entropy_with_logits`), which is
    the same value for |β Σ q| below ~17 and stays finite beyond where the reference's log(σ) clamps
    at −100.
    """
    logits = beta * (q * _mask_like(mask, q)).sum(-1)
    return F.binary_cross_entropy_with_logits(logits, acc.to(logits.dtype), reduction=reduction)


def dpo_accuracy(scores: torch.Tensor, acc: torch.Tensor, mask: torch.Tensor,
                 group_index: torch.Tensor) -> torch.Tensor:
    """The `dpo_acc` metric (scalar): how often the PRM's sequence score orders a group like the verifier.

    Q_i = Σ_t scores_{i,t} M_{i,t}. For each group, over pairs i < j (row order) of that group:
    agree_ij = [(Q_i − Q_j > 0) == (acc_i − acc_j > 0)], weighted by |acc_i − acc_j|; the group's value
    is Σ w·agree / Σ w, or 0.5 when no pair differs in acc. Result: mean over the groups present.
    A tie Q_i = Q_j counts as agreeing only when acc_i < acc_j (as the reference).
    Memory is O(B²); meant for a step's batch.
    """
    if acc.shape[0] == 0:
        return torch.tensor(0.5)
    q = (scores * _mask_like(mask, scores)).sum(-1).detach().double()
    a = acc.detach().double()
    dq = q[:, None] - q[None, :]
    da = a[:, None] - a[None, :]
    b = q.shape[0]
    pair = (group_index[:, None] == group_index[None, :]) & torch.ones(b, b, dtype=torch.bool,
                                                                          device=q.device).triu(1)
    w = da.abs() * pair
    agree = ((dq > 0) == (da > 0)).double()
    g = int(group_index.max()) + 1
    num = torch.zeros(g, dtype=q.dtype, device=q.device).index_add_(0, group_index, (w * agree).sum(1))
    den = torch.zeros(g, dtype=q.dtype, device=q.device).index_add_(0, group_index, w.sum(1))
    present = torch.zeros(g, dtype=torch.bool, device=q.device)
    present[group_index] = True
    per_group = torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(den, 0.5))
    return per_group[present].mean().to(scores.dtype)
