"""Providers: the learner's source of every StepBatch input an algorithm `requires`.

The learner never branches on an algorithm: it asks `spec.requires(cfg)` for names and builds the
provider registered under each name here (`build_providers`). An output named "ref_logprobs" fills
`StepBatch.ref_logprobs`; every other name goes to `extras`. What a provider is and may use:
`learner.provider_base`.

Built in: "ref_logprobs" (frozen reference policy, below), "teacher_logprobs" (the frozen teacher of
`teacher.path`, below: on the learner ranks, or read from the rows when its own engine scored them,
`teacher.scoring`), "prime_q" (PRIME's implicit PRM,
`learner.prm.prime`), "process_rewards" (PURE's step scores, `learner.prm.pure`); `register_provider`
adds one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from algos.spec import TEACHER
from learner.prm.prime import ImplicitPRM
from learner.prm.pure import ProcessRewards
from learner.provider_base import ModelHost, Provider, ProviderContext, run_scorer

__all__ = ["PROVIDERS", "EngineTeacherLogprobs", "ModelHost", "Provider", "ProviderContext", "ReferenceLogprobs",
           "TeacherLogprobs", "build_providers", "register_provider", "run_scorer"]


class ReferenceLogprobs(Provider):
    """log π_ref of the response tokens under the frozen initial policy (`ModelHost.reference()`)."""

    def __init__(self, host: ModelHost):
        self.host = host
        host.reference()  # build it now: a missing or broken model fails at start-up, not at step 1

    def __call__(self, ctx: ProviderContext) -> dict[str, torch.Tensor]:
        return {"ref_logprobs": self.host.reference_logprobs(ctx)}


class TeacherLogprobs(Provider):
    """log π_teacher of the response tokens under the frozen teacher model of `teacher.path`, built like the
    reference model: frozen, in model.dtype, sharded over the learner ranks (FSDP2 when world_size > 1), at
    the sampling temperature without top-k/top-p (`ModelHost.build_model`). The student's prompt and response
    token ids are scored as they are: preflight refused a teacher whose tokenizer differs
    (`launch.prep.teacher_check`)."""

    def __init__(self, host: ModelHost):
        path = host.cfg.teacher.path
        if path is None:
            raise ValueError("the algorithm requires the teacher's log-probs, but teacher.path is not set — set it to "
                             "the teacher's HF model directory")
        self.model = host.build_model(trainable=False, model_dir=Path(path))  # at start-up: a broken model fails now

    def __call__(self, ctx: ProviderContext) -> dict[str, torch.Tensor]:
        return {TEACHER: run_scorer(self.model, ctx) * ctx.response_mask}


class EngineTeacherLogprobs(Provider):
    """log π_teacher of the response tokens as the teacher's own vLLM engine scored them in the driver
    (`teacher.scoring: engine`, `launch.processes.teacher_scorer`): read from each row, masked like the
    learner-side teacher's. The learner ranks never load the teacher."""

    def __call__(self, ctx: ProviderContext) -> dict[str, torch.Tensor]:
        out = torch.zeros(len(ctx.local), ctx.width, dtype=torch.float32)
        for i, g in enumerate(ctx.local):
            scores = ctx.rows[g].teacher
            if scores is None:
                raise RuntimeError(f"row {g} of step {ctx.step} has no teacher log-probs: with teacher.scoring=engine "
                                   "the driver's teacher engine scores every row before the learner step")
            out[i, :len(scores)] = torch.from_numpy(scores)
        return {TEACHER: out.to(ctx.response_mask.device) * ctx.response_mask}


def teacher_provider(host: ModelHost) -> Provider:
    """The teacher's log-probs where `teacher.scoring` says they come from."""
    return EngineTeacherLogprobs() if host.cfg.teacher.scoring == "engine" else TeacherLogprobs(host)


ProviderFactory = Callable[[ModelHost], Provider]
PROVIDERS: dict[str, ProviderFactory] = {
    "ref_logprobs": ReferenceLogprobs,
    TEACHER: teacher_provider,
    "prime_q": ImplicitPRM,
    "process_rewards": ProcessRewards,
}


def register_provider(name: str) -> Callable[[ProviderFactory], ProviderFactory]:
    """A decorator adding a provider factory under `name` (refused when the name is taken)."""
    def deco(factory: ProviderFactory) -> ProviderFactory:
        if name in PROVIDERS:
            raise ValueError(f"provider {name!r} is already registered")
        PROVIDERS[name] = factory
        return factory
    return deco


def build_providers(names: frozenset[str], host: ModelHost) -> dict[str, Provider]:
    """Providers for `names`, in a fixed order (reference first: others may share its model)."""
    unknown = sorted(n for n in names if n not in PROVIDERS)
    if unknown:
        raise ValueError(f"the algorithm requires {unknown}, but the learner has no provider for "
                         f"{'it' if len(unknown) == 1 else 'them'}; registered: {sorted(PROVIDERS)}")
    order = sorted(names, key=lambda n: (n != "ref_logprobs", n))
    return {n: PROVIDERS[n](host) for n in order}
