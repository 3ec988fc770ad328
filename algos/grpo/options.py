"""GRPO's options, and the registration of GRPO and RLOO (torch-free; the maths is `algos.grpo.maths`)."""

from __future__ import annotations

from dataclasses import dataclass

from algos.options import option
from algos.spec import AlgoSpec, kl_requirements, register


@dataclass
class GRPOOptions:
    """--algo grpo options (`cfg.grpo`); RLOO has none of its own."""

    use_std: bool = option(True, "divide by the group std (false = Dr.GRPO)")
    eps: float = option(1e-6, "added to the group std before dividing (use_std=true)", gt=0)


register(AlgoSpec(
    name="grpo",
    summary="GRPO: group-normalised outcome reward, PPO clip (Dr.GRPO with grpo.use_std=false)",
    maths="algos.grpo.maths:GRPO",
    options=GRPOOptions,
    requires=kl_requirements,
))

register(AlgoSpec(
    name="rloo",
    summary="RLOO: leave-one-out baseline on the outcome reward, PPO clip",
    maths="algos.grpo.maths:RLOO",
    requires=kl_requirements,
))
