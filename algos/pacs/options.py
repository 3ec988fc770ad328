"""PACS' options, configuration rules and registration (torch-free; the maths is `algos.pacs.maths`;
REFERENCE_NOTES §5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from algos.options import option
from algos.spec import AlgoSpec, register

PACS_ESTIMATORS = ("rloo", "grpo", "naive")
WEIGHT_MODES = ("question", "only_positive", "only_negative", "none")
ROW_IS_MODES = ("tis", "mask", "none")  # the loss.is_correction modes PACS applies per row


@dataclass
class PacsOptions:
    """--algo pacs options (`cfg.pacs`)."""

    method: Literal[1, 2] = option(1, "1: β Σ(logπ_θ − logπ_old); 2: β mean logπ_θ")
    beta: float = option(1.0, "β of the implicit score r̂ = β Σ(log π_θ − log π_old)", gt=0)
    estimator: Literal[PACS_ESTIMATORS] = option("rloo", "group baseline of the implicit score")
    use_std: bool = option(True, "grpo estimator: divide by the group std")
    weight_mode: Literal[WEIGHT_MODES] = option(
        "question", "BCE row weights: question = class-balanced within each group holding both labels; "
                    "only_positive / only_negative = one label only; none = 1")
    masked_score: bool = option(True, "sum log-probs over response tokens only (false = reference's unmasked sum "
                                      "over the padded width)")


def pacs_problems(cfg: Any):
    """PACS' configuration rules (RunConfig.problems)."""
    lo = cfg.loss
    if lo.is_correction not in ROW_IS_MODES:
        yield (f"loss.is_correction: {lo.is_correction!r} decouples a PPO clip and PACS has none — use "
               f"one of {', '.join(ROW_IS_MODES)} (applied per row, see algos.pacs.maths.row_importance_weight)")
    if lo.ratio_level != "token":
        yield "loss.ratio_level: PACS has no PPO ratio (GSPO's sequence ratio does not apply) — set loss.ratio_level=token"
    if lo.overlong_cache_tokens:
        yield ("loss.overlong_cache_tokens: PACS' BCE labels are the 0/1 outcomes, a length penalty would make them "
               "soft — set loss.overlong_cache_tokens=0 (loss.overlong_filter works with PACS)")


register(AlgoSpec(
    name="pacs",
    summary="PACS: BCE between the group advantage of the implicit score β·Σ log π_θ/π_old and the outcome",
    maths="algos.pacs.maths:MATHS",
    options=PacsOptions,
    whole_groups_per_microbatch=True,
    skip_nonfinite_grad=True,
    clip_grad=False,
    validate=pacs_problems,
))
