"""What a provider is: the context it reads for one step, its base class, the narrow view of the learner it
gets (`ModelHost`), and `run_scorer`, the micro-batched forward every model-holding provider uses.

A provider runs on every rank for that rank's rows (in the step's micro-batches, because sharded models
make forward passes collective) and returns per-row [b_local, T] tensors; the learner gathers them over
ranks into the global StepBatch. The built-in providers and the table of names are `learner.providers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from learner.batching import MicroBatch, Row
from learner.fsdp import ensure_sharded


class ModelHost(Protocol):
    """What a provider may use of the learner (`learner.learner.Learner` is one)."""

    cfg: Any  # the run's RunConfig
    rank: int
    world_size: int
    device: torch.device
    compute_dtype: torch.dtype
    tokenizer: Any

    def build_model(self, *, trainable: bool, truncate: bool = False,
                    model_dir: str | Path | None = None) -> torch.nn.Module:
        """A new copy of the policy's initial weights (or of the HF model in `model_dir`), sharded like the
        policy (a `TokenScorer`)."""

    def reference(self) -> torch.nn.Module:
        """The frozen reference policy (built once, shared by every provider that asks)."""

    def reference_logprobs(self, ctx: ProviderContext) -> torch.Tensor:
        """[b_local, T] log π_ref of this rank's rows."""


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
