"""The algorithm registry: each `--algo` name maps to an `AlgoSpec`.

The learner is algorithm-blind. For every optimiser step it
  1. builds a `StepBatch` (masks, groups, rewards, π_prox and μ log-probs, plus whatever auxiliary
     inputs the spec `requires`, produced by providers registered under those names in `learner/`),
  2. calls `spec.advantage(batch, cfg)` once on the whole step (no grad),
  3. for each micro-batch, forms a `LossContext` and sums `weight(cfg) · component(ctx, cfg)` over
     `spec.losses`, skipping components whose weight is 0.
Adding an algorithm is a new module that calls `register(AlgoSpec(...))` plus its line in `_load_builtin`:
the `--algo` choices, the CLI help and the config's `algo` field come from this registry, the spec
checks its own configuration rules (`validate`), and nothing else in the code base branches on an
algorithm name. Options of its own need a section in configs/schema.py (pydantic, which `algos/` does
not import) and a configs/<name>.yaml to start from.

`cfg` is the run configuration (`configs.schema.RunConfig`, duck-typed here so `algos/` imports only
torch); each spec documents the attributes it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from algos.aggregation import LossNorm


@dataclass
class StepBatch:
    """All per-row/per-token inputs of one optimiser step (or a micro-batch slice of it). No grad.

    response_mask  [B, T] float  1 on response tokens (generated or demonstration)
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
    loss: torch.Tensor  # scalar, already aggregated with ctx.norm (unweighted)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class LossComponent:
    name: str
    fn: Callable[[LossContext, Any], LossTerm]
    weight: Callable[[Any], float] = lambda cfg: 1.0
    needs_entropy: bool = False


AdvantageFn = Callable[[StepBatch, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class AlgoSpec:
    name: str
    summary: str
    losses: tuple[LossComponent, ...]
    advantage: AdvantageFn | None = None
    # StepBatch inputs the learner must provide for this config ("ref_logprobs", or extras names
    # served by providers in learner/): a function of cfg because optional terms (KL) add inputs.
    requires: Callable[[Any], frozenset[str]] = lambda cfg: frozenset()
    whole_groups_per_microbatch: bool = False  # PACS: a micro-batch must never split a group
    trains_on_demonstrations_only: bool = False  # SFT: no rollouts, no actors
    needs_demonstrations: bool = False  # the run loads teacher/demonstration trajectories (LUFFY, SFT)
    skip_nonfinite_grad: bool = False  # PACS: a non-finite grad norm skips the step (counted)
    clip_grad: bool = True  # PACS never clips (reference behaviour, §5)
    # Smallest rollout.n the advantage can use: every built-in algorithm compares a sample with the other
    # samples of its group (GRPO/RLOO/leave-one-out baselines), which a group of one does not have.
    min_group_size: int = 2
    # The algorithm's own configuration rules: yields "dotted.key: what is wrong — how to fix" for cfg
    # (RunConfig.problems adds them to the rules every algorithm shares, before anything starts).
    validate: Callable[[Any], Iterable[str]] = lambda cfg: ()


PROX = "old_logprobs"  # a `requires` name: the advantage or a provider reads π_prox before any update

_REGISTRY: dict[str, AlgoSpec] = {}


def register(spec: AlgoSpec) -> AlgoSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"algorithm {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> AlgoSpec:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {names()}") from None


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # Importing the modules runs their register() calls.
    from algos import grpo, luffy, pacs, prime, pure, sft  # noqa: F401
