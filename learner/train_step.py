"""The loss side of one optimiser step: global normalisers, the registry's loss terms, backward.

Global normalisation (ALGORITHMS.md "Loss aggregation"): each micro-batch's loss is divided by
counts of the *whole* step — `LossNorm` merged over this rank's micro-batches, then summed over ranks
with one all-reduce before any backward — so Σ over micro-batches and ranks of the micro-batch losses
is exactly the loss of the full batch.

FSDP gradient averaging: FSDP2 reduce-scatters gradients with an *average* over the data-parallel
ranks, but the step's gradient is the *sum* of the ranks' partial gradients (each already divided by
the global counts). Every backward therefore uses loss × world_size; the average then equals the sum
(exactly, for power-of-two world sizes), and one rank with the whole batch gets the same update.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import fields, replace

import torch
import torch.distributed as dist

from algos.aggregation import LossNorm, aggregate
from algos.batch import LossContext, StepBatch
from algos.overlong import loss_mask
from algos.spec import AlgoSpec
from learner.batching import MicroBatch
from learner.distributed import all_reduce_sum, reduce_weighted


def global_norm(batch: StepBatch, microbatches: list[MicroBatch], cfg) -> LossNorm:
    """LossNorm of one optimiser step's rows: this rank's micro-batches merged, then all-reduced over
    ranks. Tokens are counted under the loss mask (`algos.overlong.loss_mask`: without DAPO's truncated
    rows when loss.overlong_filter); T_pad is rollout.max_response_tokens."""
    max_len = cfg.rollout.max_response_tokens
    norm = LossNorm(0.0, 0.0, 0.0, float(max_len))
    for mb in microbatches:
        if not mb.dummy:
            sub = batch.rows(torch.tensor(mb.rows, device=batch.response_mask.device))
            norm = norm.merge(LossNorm.local(loss_mask(sub, sub.response_mask, cfg), max_len=max_len))
    tokens, seqs, rows = all_reduce_sum([norm.num_tokens, norm.num_seqs, norm.num_rows])
    return LossNorm(tokens, seqs, rows, float(max_len))


def narrow(batch: StepBatch, width: int) -> StepBatch:
    """The batch with every [B, T] tensor cut to its first `width` columns (the micro-batch's own width)."""
    t = batch.response_mask.shape[1]

    def cut(v):
        if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == t:
            return v[:, :width]
        return v

    out = {f.name: cut(getattr(batch, f.name)) for f in fields(batch) if f.name != "extras"}
    return replace(batch, **out, extras={k: cut(v) for k, v in batch.extras.items()})


def active_components(spec: AlgoSpec, cfg) -> list[tuple]:
    """(component, weight) for the spec's loss terms whose weight under cfg is non-zero."""
    out = []
    for c in spec.losses:
        w = float(c.weight(cfg))
        if w != 0.0:
            out.append((c, w))
    return out


ENTROPY = "entropy"  # the metric key of the entropy term (algos.policy_gradient.entropy_bonus)


def entropy_metric(entropy: torch.Tensor, batch: StepBatch, cfg, norm: LossNorm) -> torch.Tensor:
    """The `entropy` metric of a micro-batch when no loss term reports it: the entropy term's value
    (aggregated under `loss.agg` over the loss mask, divided by the step's global counts, so the sums
    over micro-batches and ranks give the step's value), from a detached entropy [b, T]."""
    return aggregate(entropy, loss_mask(batch, batch.response_mask, cfg), cfg.loss.agg, norm)


def _union_over_ranks(keys: set[str]) -> set[str]:
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[list[str]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, sorted(keys))
        return set().union(*map(set, gathered))
    return keys


def train_microbatches(policy: torch.nn.Module, spec: AlgoSpec, cfg, batch: StepBatch, advantages: torch.Tensor,
                       microbatches: list[MicroBatch], norm: LossNorm, world_size: int, *,
                       prox_from_forward: bool = False) -> dict[str, float]:
    """Forward/backward every micro-batch (gradients accumulate); returns metrics reduced over ranks.

    `prox_from_forward`: the step is a single optimiser step and π_prox was not computed; each
    micro-batch's π_prox is its own forward's detached log-probs (the same numbers, one forward less).

    loss/<component> and loss/total are sums over micro-batches and ranks (each part is already
    divided by the global counts, so the sum is the step's loss). The metrics a term declares `summed`
    (its own loss under another name, e.g. sft/nll, entropy) are summed the same way; every other metric
    is a mean over micro-batches weighted by response tokens (maxima such as is/weight_max become such
    means too).

    `entropy` is reported every step (docs/metrics.md): by the entropy term when its coefficient is
    set, otherwise here, with the term's definition (`entropy_metric`), from the entropy the training
    forward computes detached from the logits it has anyway (no second forward, no gradient, not
    recomputed in backward: `learner.logprobs._head_chunk`).
    """
    comps = active_components(spec, cfg)
    if not comps:
        raise ValueError(f"every loss term of {spec.name!r} has weight 0 under this config; nothing to train")
    need_entropy = any(c.needs_entropy for c, _ in comps)
    device = batch.response_mask.device
    loss_sums: dict[str, float] = defaultdict(float)
    msum: dict[str, float] = defaultdict(float)
    mweight: dict[str, float] = defaultdict(float)
    summed: set[str] = set()
    for mb in microbatches:
        logp, ent = policy(**mb.inputs(), with_entropy=True, entropy_grad=need_entropy)
        if mb.dummy:  # keeps FSDP's collectives in step with ranks that have more work
            ((logp.sum() + ent.sum()) * 0.0).backward()
            continue
        idx = torch.tensor(mb.rows, dtype=torch.long, device=device)
        sub = narrow(batch.rows(idx), mb.width)
        logprobs = mb.scatter(logp)
        if prox_from_forward:
            sub = replace(sub, old_logprobs=logprobs.detach() * sub.response_mask)
        ctx = LossContext(logprobs=logprobs, entropy=mb.scatter(ent) if need_entropy else None,
                          batch=sub, advantages=advantages[idx, :mb.width], norm=norm)
        total = torch.zeros((), device=device)
        weight = float(sub.response_mask.sum())
        reported: set[str] = set()
        for comp, w in comps:
            term = comp.fn(ctx, cfg)
            reported |= term.metrics.keys()
            total = total + w * term.loss
            loss_value = float(term.loss.detach())
            loss_sums[f"loss/{comp.name}"] += loss_value
            for k, v in term.metrics.items():
                v = float(v)
                if k in term.summed:  # a partial sum of a globally normalised value
                    summed.add(k)
                    loss_sums[k] += v
                else:
                    msum[k] += v * weight
                    mweight[k] += weight
        if ENTROPY not in reported:  # no term reported it: the metric alone, from the detached entropy
            summed.add(ENTROPY)
            loss_sums[ENTROPY] += float(entropy_metric(mb.scatter(ent), sub, cfg, norm))
        (total * world_size).backward()
        loss_sums["loss/total"] += float(total.detach())
    keys = sorted({f"loss/{c.name}" for c, _ in comps} | {"loss/total"} | _union_over_ranks(summed))
    totals = dict(zip(keys, all_reduce_sum([loss_sums.get(k, 0.0) for k in keys])))
    return totals | reduce_weighted(dict(msum), dict(mweight))
