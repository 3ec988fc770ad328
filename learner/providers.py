"""Providers: the learner's source of every StepBatch input an algorithm `requires`.

The learner never branches on an algorithm: it asks `spec.requires(cfg)` for names and builds the
provider registered under each name here. A provider runs on every rank for that rank's rows (in
the step's micro-batches, because sharded models make forward passes collective) and returns
per-row [b_local, T] tensors; the learner gathers them over ranks into the global StepBatch. An
output named "ref_logprobs" fills `StepBatch.ref_logprobs`; every other name goes to `extras`.

Registered: "ref_logprobs" (frozen reference policy, below), "prime_q" (PRIME's implicit PRM,
`learner.prime_prm`), "process_rewards" (PURE's step scores, `learner.pure_prm`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from learner.batching import MicroBatch, Row
from learner.fsdp import ensure_sharded

if TYPE_CHECKING:
    from learner.learner import Learner


@dataclass
class ProviderContext:
    """Everything a provider may read for one step (this rank's part of it)."""

    rows: list[Row]  # all rows of the step, global order
    local: list[int]  # global indices of this rank's rows: outputs are [len(local), width] in this order
    microbatches: list[MicroBatch]  # this rank's micro-batches (a dummy one has `dummy=True`)
    width: int  # response width T of the step's StepBatch
    old_logprobs: torch.Tensor  # [len(local), width] π_prox of this rank's rows
    response_mask: torch.Tensor  # [len(local), width]
    rewards: torch.Tensor  # [len(local)] outcome rewards
    num_rows: int  # rows of the whole step (all ranks): the global normaliser of per-row losses
    step: int


class Provider:
    """Base class: `__call__` returns {name: [b_local, T] tensor}; optional metrics and state."""

    def __call__(self, ctx: ProviderContext) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        return {}

    def save(self, directory: Path, rank: int) -> None:  # noqa: B027 - optional hook
        """Write state (collective when it holds sharded tensors; rank 0 writes files)."""

    def load(self, directory: Path) -> None:  # noqa: B027 - optional hook
        """Restore what `save` wrote."""


ProviderFactory = Callable[["Learner"], Provider]
PROVIDERS: dict[str, ProviderFactory] = {}


def register_provider(name: str) -> Callable[[ProviderFactory], ProviderFactory]:
    def deco(factory: ProviderFactory) -> ProviderFactory:
        if name in PROVIDERS:
            raise ValueError(f"provider {name!r} is already registered")
        PROVIDERS[name] = factory
        return factory
    return deco


def build_providers(names: frozenset[str], learner: Learner) -> dict[str, Provider]:
    """Providers for `names`, in a fixed order (reference first: others may share its model)."""
    _load_builtin()
    unknown = sorted(n for n in names if n not in PROVIDERS)
    if unknown:
        raise ValueError(f"the algorithm requires {unknown}, but the learner has no provider for "
                         f"{'it' if len(unknown) == 1 else 'them'}; registered: {sorted(PROVIDERS)}")
    order = sorted(names, key=lambda n: (n != "ref_logprobs", n))
    return {n: PROVIDERS[n](learner) for n in order}


def _load_builtin() -> None:
    from learner import prime_prm, pure_prm  # noqa: F401  (their imports register providers)


def run_scorer(scorer: torch.nn.Module, ctx: ProviderContext, *, grad: bool = False,
               per_microbatch: Callable[[MicroBatch, torch.Tensor], Any] | None = None) -> torch.Tensor:
    """Log-probs of this rank's rows under a `TokenScorer`, micro-batch by micro-batch: [b_local, T].

    Every rank must call it (FSDP forwards are collective; dummy micro-batches keep counts equal).
    With `grad`, `per_microbatch(mb, logp [b_k, T_k])` receives each micro-batch's log-probs with their
    graph (to build and backward a loss) before the next one runs; for a dummy micro-batch logp is
    [1, 1] and must enter the loss with weight 0. The returned tensor is detached either way.
    """
    pos = {g: i for i, g in enumerate(ctx.local)}
    out = torch.zeros(len(ctx.local), ctx.width, dtype=torch.float32, device=ctx.old_logprobs.device)
    for mb in ctx.microbatches:
        with torch.set_grad_enabled(grad):
            logp, _ = scorer(**mb.inputs())
        dense = logp.reshape(1, 1) if mb.dummy else mb.scatter(logp)
        if per_microbatch is not None:
            per_microbatch(mb, dense)
        if mb.dummy:
            continue
        idx = torch.tensor([pos[g] for g in mb.rows], dtype=torch.long, device=out.device)
        out[idx, :mb.width] = dense.detach().float()
    if not grad:
        ensure_sharded(scorer)
    return out


@register_provider("ref_logprobs")
class ReferenceLogprobs(Provider):
    """log π_ref of the response tokens under the frozen initial policy (`Learner.reference()`)."""

    def __init__(self, learner: Learner):
        self.learner = learner
        learner.reference()  # build it now: a missing or broken model fails at start-up, not at step 1

    def __call__(self, ctx: ProviderContext) -> dict[str, torch.Tensor]:
        return {"ref_logprobs": self.learner.reference_logprobs(ctx)}
