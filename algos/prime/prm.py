"""PRIME's implicit process reward model (PRM): rewards from log-probs, normalisation, PRM loss, metrics.

Pure functions used by PRIME's advantage (`algos.prime.maths`) and by the learner's implicit-PRM provider,
which holds π_φ (the PRM, a causal LM) and π_ref, computes per-token log-probs, and trains π_φ on its
own optimiser with `prm_ce_loss` (`prime.prm_loss=ce`) or `prm_detach_dpo_loss` (`dpo`, `bon_acc`,
`bon_rm`: PRIME-verl's `compute_detach_dpo_loss_rm`, REFERENCE_NOTES §2.3).

Shapes: B rows, T padded response width; `mask` [B, T] (bool or 0/1) marks response tokens. Every
[B, T] output is 0 where the mask is 0 unless a docstring says otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from algos.prime.options import GRANULARITIES, NORMS
from algos.returns import discounted_returns, last_token_index, suffix_sum

# `prime.prm_loss` (other than ce) -> bon_mode of `prm_detach_dpo_loss` (PRIME-verl `reward_model.model.loss_type`)
DETACH_BON_MODES = {"dpo": "none", "bon_acc": "bon_acc", "bon_rm": "bon_rm"}


def _mask_like(mask: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(x)
    if mask.shape != x.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values {tuple(x.shape)}")
    return mask.to(x.dtype)


def implicit_process_reward(
    q: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.05,
    raw_q: bool = False,
    granularity: str = "token",
    *,
    lam: float = 0.0,
    use_gt: bool = False,
    acc: torch.Tensor | None = None,
    drop_last_token: bool = False,
) -> torch.Tensor:
    """Process reward [B, T] from q [B, T] (acc [B]: outcome accuracies, read only by `use_gt`).

    With e_i the row's last response token and c = β (paper, PRIME-verl, default) or c = 1 (`raw_q`,
    PRIME-orig):
      q'_t = c·q_t·M_t
      lam = 0 (default): r_t = q'_t.
      lam > 0 (mirrors PRIME-verl `reward_model.lambda`): if `use_gt` (mirrors PRIME-verl
               `prime_use_gt`) the last token is replaced first, q'_{e_i} = acc_i − Σ_{t<e_i} q'_t (so
               Σ_t q'_t = acc_i), then r_t = Σ_{k≥t} λ^{k−t} q'_k (right to left). `use_gt` has no
               effect at lam = 0, as in PRIME-verl (whose λ = 0 branch never reads `prime_use_gt`).
    Granularity:
      token  every response token carries r_t; with `drop_last_token` (mirrors PRIME-verl's `token`
             copy, which only fills t < e_i) the last response token gets 0 — with `use_gt` the
             acc-based value then reaches the output only through its λ-discounted share of r_{t<e_i}.
      whole  the row's total Σ_{t≤e_i} r_t sits at e_i (the total that `token` spreads over the row; at
             lam = 0 this is c·Σ_t q_t M_t, PRIME-orig `whole`). `drop_last_token` with `whole` is a
             ValueError (it would erase the whole reward).
    Empty rows stay 0 in every mode.

    Deviations from the reference: PRIME-verl's `whole` granularity crashes (shape error); here it is
    defined as above for every λ. PRIME-verl always drops the last token's reward (`drop_last_token=True`
    reproduces it); the default keeps it, as PRIME-orig. PRIME-verl's λ path always uses β; here
    `raw_q` applies to it too (c = 1).
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown prime granularity {granularity!r}; choose one of {GRANULARITIES}")
    if drop_last_token and granularity == "whole":
        raise ValueError("prime.drop_last_token=true needs prime.granularity=token (with `whole` it would "
                         "drop the row's whole reward) — set one of them differently")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"prime.lam must lie in [0, 1] (got {lam})")
    m = _mask_like(mask, q)
    r = q * m * (1.0 if raw_q else beta)
    last = last_token_index(m)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    if lam > 0:
        if use_gt:
            if acc is None or acc.shape != (q.shape[0],):
                raise ValueError("prime.use_gt needs the outcome accuracies acc [B]")
            before_last = m.clone()
            before_last[rows, last[rows]] = 0.0
            r = r.clone()
            r[rows, last[rows]] = acc.to(r.dtype)[rows] - (r * before_last).sum(-1)[rows]
        r = discounted_returns(r, m, lam)
    if granularity == "token":
        if drop_last_token:
            r = r.clone()
            r[rows, last[rows]] = 0.0
        return r * m
    out = torch.zeros_like(r)
    out[rows, last[rows]] = (r * m).sum(-1)[rows]
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


def dpo_abs_accuracy(scores: torch.Tensor, acc: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The `dpo_acc_abs` metric (scalar; mirrors PRIME-verl `compute_dpo_abs_accuracy`): the fraction of
    rows whose sequence score has the sign of the outcome, mean_i [sign(Σ_t s_{i,t} M_{i,t}) ==
    sign(2·acc_i − 1)] with sign(0) = 0 (a zero score agrees only with acc_i = 0.5). No grouping.

    Deviations from the reference: an empty batch gives 0.5 (the reference's mean of nothing is NaN).
    """
    if acc.shape[0] == 0:
        return torch.tensor(0.5)
    total = (scores * _mask_like(mask, scores)).sum(-1).detach()
    return (torch.sign(total) == torch.sign(2.0 * acc.detach().to(total.dtype) - 1.0)).to(scores.dtype).mean()


def group_members(values: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's view of its whole group: values [B] -> (members [B, n_max], valid [B, n_max] bool).

    Row i gets the values of every row j with group_index_j == group_index_i (itself included) in row
    order, left-aligned; slots past its group's size hold 0 and valid False. With contiguous groups of
    n this is PRIME-verl's `Q_bc`/`acc_bc` broadcast (`.view(-1, n)` expanded to every member).
    """
    if values.dim() != 1 or group_index.shape != values.shape:
        raise ValueError("values and group_index must both be [B]")
    b = values.shape[0]
    if b == 0:
        return values.new_zeros(0, 0), torch.zeros(0, 0, dtype=torch.bool, device=values.device)
    g = int(group_index.max()) + 1
    order = torch.argsort(group_index, stable=True)
    counts = torch.bincount(group_index, minlength=g)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(b, device=values.device) - starts[group_index[order]]
    n_max = int(counts.max())
    table = values.new_zeros(g, n_max)
    table[group_index[order], slot] = values[order]
    valid = torch.arange(n_max, device=values.device)[None, :] < counts[:, None]
    return table[group_index], valid[group_index]


def prm_detach_dpo_loss(
    q: torch.Tensor,
    acc: torch.Tensor,
    mask: torch.Tensor,
    q_bc: torch.Tensor,
    acc_bc: torch.Tensor,
    beta: float = 0.05,
    bon_mode: str = "none",
    *,
    bc_mask: torch.Tensor | None = None,
    reduction: str | None = None,
) -> torch.Tensor:
    """PRIME-verl's detached DPO PRM loss (mirrors `compute_detach_dpo_loss_rm`; `prime.prm_loss` dpo ->
    bon_mode `none`, bon_acc -> `bon_acc`, bon_rm -> `bon_rm`).

    Inputs: q [B, T] (log π_φ − log π_ref with its graph), acc [B]; q_bc [B, n] and acc_bc [B, n]: for
    row i, the raw sequence sums Σ_t q_{j,t} M_{j,t} (from a no-grad forward *before* the update; no
    gradient) and the accuracies of the members j of its group, itself included (`group_members`);
    bc_mask [B, n] marks real members (default: all; n_i = Σ_j bc_mask_ij).
      Q_i     = β Σ_t q_{i,t} M_{i,t}
      C_i     = {j : acc_bc_ij < acc_i} if acc_i > 0 else {j : acc_bc_ij > acc_i}
      other_i = β · mean_{j∈C_i} q_bc_ij   (0 when C_i is empty)
      s_i     = +1 if acc_i > 0 else −1
      ℓ_i     = −log σ((Q_i − other_i) · s_i)
      w_i     = 1 (none); n_i·(mean_j [acc_bc_ij ≤ acc_i])^{n_i−1} (bon_acc);
                n_i·(mean_j [β·q_bc_ij ≤ Q_i])^{n_i−1} (bon_rm; Q_i's value, no gradient through w).
    Reduction of w_i·ℓ_i: `None` (default) = the reference's, a mean over rows for bon_mode `none` and a
    weighted **sum** over rows for the bon modes; or `mean` (Σ/B), `sum`, `none` ([B]). The learner
    uses `sum` divided by the rows of the whole step (learner/prm/prime.py).

    Deviations from the reference: ℓ is computed as −logsigmoid (finite where the reference's
    log(sigmoid) underflows to −inf, beyond |x| ≈ 88 in float32); groups may be ragged (`bc_mask`).
    """
    if bon_mode not in ("none", "bon_acc", "bon_rm"):
        raise ValueError(f"unknown bon_mode {bon_mode!r}; choose none, bon_acc or bon_rm")
    if reduction not in (None, "mean", "sum", "none"):
        raise ValueError(f"unknown reduction {reduction!r}; choose mean, sum or none")
    if q_bc.shape != acc_bc.shape or q_bc.shape[0] != q.shape[0]:
        raise ValueError(f"q_bc {tuple(q_bc.shape)} and acc_bc {tuple(acc_bc.shape)} must both be [B, n] "
                         f"with B = {q.shape[0]}")
    valid = torch.ones_like(q_bc, dtype=torch.bool) if bc_mask is None else bc_mask.bool()
    q_bc = q_bc.detach().to(q.dtype)
    a = acc.detach().to(q.dtype)
    a_bc = acc_bc.detach().to(q.dtype)
    cur = (q * _mask_like(mask, q)).sum(-1) * beta
    positive = a > 0
    chosen = valid & torch.where(positive[:, None], a_bc < a[:, None], a_bc > a[:, None])
    count = chosen.sum(-1)
    other = torch.where(count > 0, (q_bc * chosen).sum(-1) / count.clamp_min(1) * beta, torch.zeros_like(cur))
    sign = positive.to(q.dtype) * 2.0 - 1.0
    loss = -F.logsigmoid((cur - other) * sign)
    if bon_mode != "none":
        n = valid.sum(-1).to(q.dtype)
        if bon_mode == "bon_rm":
            below = (q_bc * beta <= cur.detach()[:, None]) & valid
        else:
            below = (a_bc <= a[:, None]) & valid
        frac = below.sum(-1).to(q.dtype) / n.clamp_min(1.0)
        loss = loss * (n * frac.pow(n - 1.0))
    if reduction is None:
        reduction = "mean" if bon_mode == "none" else "sum"
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss
