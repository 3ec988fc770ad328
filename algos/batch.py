"""What a loss sees: the step's inputs (`StepBatch`), one micro-batch (`LossContext`), a term's result
(`LossTerm`). The torch half of the registry (`algos.spec` is the other).

Shapes: B rows (responses), T padded response width; masks are [B, T] with 1 on response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from algos.aggregation import LossNorm


@dataclass
class StepBatch:
    """All per-row/per-token inputs of one optimiser step (or a micro-batch slice of it). No grad.

    response_mask  [B, T] float  1 on response tokens (generated or demonstration); 0 on padding and on the
                                 environment tokens of multi-turn rows (tool results, observations), so
                                 every term masked by it ignores them
    prefix_mask    [B, T] bool   True on off-policy demonstration tokens (LUFFY); else all False
    group_index    [B] int64     group (prompt) id in [0, G)
    rewards        [B] float     verifiable outcome reward
    old_logprobs   [B, T] float  π_prox: learner log-probs recomputed at the start of the step (before its
                                 first optimiser step). None in the advantage when the spec does not
                                 require PROX and the step is one optimiser step: the loss then gets the
                                 detached log-probs of its own forward (equal to π_prox there)
    behav_logprobs [B, T] float  μ: the sampler's log-probs (0 on demonstration tokens)
    ref_logprobs   [B, T] float  frozen reference policy (only when required)
    extras         provider outputs keyed by name (documented by the spec that requires them)
    step           optimiser step index (0-based) the batch is trained at
    truncated      [B] bool      the sample hit the generation limit before an eos (`Sample.truncated`);
                                 None at construction means all False (DAPO overlong handling, algos.overlong)
    """

    response_mask: torch.Tensor
    prefix_mask: torch.Tensor
    group_index: torch.Tensor
    rewards: torch.Tensor
    old_logprobs: torch.Tensor | None
    behav_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    truncated: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.truncated is None:
            self.truncated = torch.zeros(self.response_mask.shape[0], dtype=torch.bool,
                                         device=self.response_mask.device)

    @property
    def on_policy_mask(self) -> torch.Tensor:
        """[B, T] float: generated (non-demonstration) response tokens."""
        return self.response_mask * (~self.prefix_mask).to(self.response_mask.dtype)

    def rows(self, index: torch.Tensor) -> StepBatch:
        """The sub-batch of the given rows (tensors with a leading B dimension are sliced)."""
        b = self.response_mask.shape[0]

        def take(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == b:
                return v[index]
            return v

        out = {f.name: take(getattr(self, f.name)) for f in fields(self) if f.name != "extras"}
        return replace(self, **out, extras={k: take(v) for k, v in self.extras.items()})


@dataclass
class LossContext:
    """One micro-batch: current log-probs (with grad) + the step's fixed inputs for these rows."""

    logprobs: torch.Tensor  # [b, T] log π_θ, carries the gradient
    entropy: torch.Tensor | None  # [b, T] token entropy of π_θ (with grad) or None when not computed
    batch: StepBatch  # the micro-batch slice
    advantages: torch.Tensor  # [b, T] from spec.advantage (zeros if the spec has none)
    norm: LossNorm  # global normalisers of the whole step


@dataclass
class LossTerm:
    """A loss component's result. The learner logs each metric as a mean over micro-batches weighted by
    response tokens, except the keys in `summed`: those are partial sums of a globally normalised value
    (the term's own loss, e.g. sft/nll), added over micro-batches and ranks like the loss itself."""

    loss: torch.Tensor  # scalar, already aggregated with ctx.norm (unweighted)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    summed: frozenset[str] = frozenset()
