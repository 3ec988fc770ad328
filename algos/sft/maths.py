"""SFT warm-up: token negative log-likelihood on demonstration tokens (registration: `algos.sft.options`).

Uses the same learner, loader and checkpoints as RL; the batch's response tokens are demonstrations.
Reads `cfg.loss.agg` for the aggregation (default token-mean).
"""

from __future__ import annotations

from typing import Any

import torch

from algos.aggregation import LossNorm, aggregate
from algos.batch import LossContext, LossTerm
from algos.spec import LossComponent, Maths


def nll_loss(logprobs: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean",
             norm: LossNorm | None = None) -> torch.Tensor:
    """−Σ log π_θ(y_t) over masked tokens, aggregated: [B, T] -> scalar."""
    return aggregate(-logprobs, mask, agg, norm)


def _nll(ctx: LossContext, cfg: Any) -> LossTerm:
    loss = nll_loss(ctx.logprobs, ctx.batch.response_mask, cfg.loss.agg, ctx.norm)
    return LossTerm(loss, {"sft/nll": loss.detach()}, summed=frozenset({"sft/nll"}))


MATHS = Maths(losses=(LossComponent("nll", _nll),))
