"""The algorithm registry: each `--algo` name maps to an `AlgoSpec`. Imports neither torch nor pydantic.

The learner is algorithm-blind. For every optimiser step it
  1. builds a `StepBatch` (`algos.batch`: masks, groups, rewards, π_prox and μ log-probs, plus whatever
     auxiliary inputs the spec `requires`, produced by the providers of `learner/` under those names),
  2. calls `spec.advantage(batch, cfg)` once on the whole step (no grad),
  3. for each micro-batch, forms a `LossContext` and sums `weight(cfg) · component(ctx, cfg)` over
     `spec.losses`, skipping components whose weight is 0.
The config side reads the rest of the spec: its `options` (the `cfg.<name>` section), its own rules
(`validate`), the files it loads (`files`, `path_keys`) and its capabilities. None of that needs
torch, so the spec names its maths by reference (`maths="algos.grpo.maths:GRPO"`, imported on first use) and
`configs` validates a run without importing torch.

Discovery: every module `algos/<name>/options.py` is imported the first time the registry is read, and its
`register(...)` calls fill it (docs/algorithms.md, "Adding an algorithm"). Nothing else in the code base
branches on an algorithm name.

`cfg` is the run configuration (`configs.schema.RunConfig`, duck-typed here); each spec documents the
attributes it reads.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from algos.batch import LossContext, LossTerm, StepBatch

PROX = "old_logprobs"  # a `requires` name: the advantage or a provider reads π_prox before any update
TEACHER = "teacher_logprobs"  # a `requires` name: log π_teacher of the response tokens (the model at teacher.path)
OPTIONS_MODULE = "options"  # algos/<name>/options.py: an algorithm's options, rules and registration


@dataclass(frozen=True)
class LossComponent:
    """One loss term: `fn(ctx, cfg) -> LossTerm`, added with `weight(cfg)` (0 = skipped)."""

    name: str
    fn: Callable[[LossContext, Any], LossTerm]
    weight: Callable[[Any], float] = lambda cfg: 1.0
    needs_entropy: bool = False


AdvantageFn = Callable[["StepBatch", Any], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]


@dataclass(frozen=True)
class Maths:
    """The torch side of an algorithm: its loss terms and its advantage (None = the losses need none)."""

    losses: tuple[LossComponent, ...]
    advantage: AdvantageFn | None = None


@dataclass(frozen=True)
class AlgoSpec:
    name: str
    summary: str
    # Maths, or "module:attribute" naming one (imported on the first `losses`/`advantage` read).
    maths: Maths | str
    # The dataclass of the `cfg.<name>` section (fields made with `algos.options.option`); None = no section.
    options: type | None = None
    # StepBatch inputs the learner must provide for this config ("ref_logprobs", or extras names
    # served by providers in learner/): a function of cfg because optional terms (KL) add inputs.
    requires: Callable[[Any], frozenset[str]] = lambda cfg: frozenset()
    whole_groups_per_microbatch: bool = False  # PACS: a micro-batch must never split a group
    trains_on_demonstrations_only: bool = False  # SFT: no rollouts, no actors
    needs_demonstrations: bool = False  # the run loads teacher/demonstration trajectories (LUFFY, SFT)
    guided_rows: bool = False  # actors prompt some rows with a demonstration prefix (LUFFY)
    skip_nonfinite_grad: bool = False  # PACS: a non-finite grad norm skips the step (counted)
    clip_grad: bool = True  # PACS never clips (reference behaviour, §5)
    # Smallest rollout.n the advantage can use: every built-in algorithm compares a sample with the other
    # samples of its group (GRPO/RLOO/leave-one-out baselines), which a group of one does not have.
    min_group_size: int = 2
    # The algorithm's own configuration rules: yields "dotted.key: what is wrong — how to fix" for cfg
    # (RunConfig.problems adds them to the rules every algorithm shares, before anything starts).
    validate: Callable[[Any], Iterable[str]] = lambda cfg: ()
    # Files and plugins the run will load, checked before start (`launch.prep.preflight`): (dotted key, kind)
    # with kind "hf_dir" (an HF model directory) or "function" (module:function or file.py:function).
    files: Callable[[Any], Iterable[tuple[str, str]]] = lambda cfg: ()
    # Dotted keys of its options that hold filesystem paths (made absolute at launch, `launch.state.storage`).
    path_keys: tuple[str, ...] = ()

    def _maths(self) -> Maths:
        if isinstance(self.maths, Maths):
            return self.maths
        module, _, attr = self.maths.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def losses(self) -> tuple[LossComponent, ...]:
        return self._maths().losses

    @property
    def advantage(self) -> AdvantageFn | None:
        return self._maths().advantage


def kl_requirements(cfg: Any) -> frozenset[str]:
    """The inputs of the shared KL-to-reference loss term: reference log-probs when loss.kl_coef > 0."""
    return frozenset({"ref_logprobs"}) if cfg.loss.kl_coef > 0 else frozenset()


_REGISTRY: dict[str, AlgoSpec] = {}


def register(spec: AlgoSpec) -> AlgoSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"algorithm {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> AlgoSpec:
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {names()}") from None


def names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def _discover() -> None:
    """Import every `algos/<name>/options.py` module (each once: a module registers its specs when
    imported). An algorithm's folder needs no `__init__.py` to be found."""
    package = sys.modules[__package__]
    for folder in package.__path__:
        for options in sorted(Path(folder).glob(f"*/{OPTIONS_MODULE}.py")):
            importlib.import_module(f"{__package__}.{options.parent.name}.{OPTIONS_MODULE}")
