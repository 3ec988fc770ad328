"""The registration of SFT (no options of its own; torch-free; the maths is `algos.sft.maths`)."""

from algos.spec import AlgoSpec, register

register(AlgoSpec(
    name="sft",
    summary="SFT warm-up: token NLL on demonstrations",
    maths="algos.sft.maths:MATHS",
    trains_on_demonstrations_only=True,
    needs_demonstrations=True,
))
