"""LUFFY's options, configuration rules and registration (torch-free; the maths is `algos.luffy.maths`,
`algos.luffy.loss`, and `algos.luffy.prefix` for the actors' guided rows; REFERENCE_NOTES §4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from algos.options import option
from algos.spec import AlgoSpec, kl_requirements, register

PREFIX_STRATEGIES = ("random", "fixed", "linear", "reverse_linear", "linear_max")
LUFFY_ESTIMATORS = ("grpo_split", "grpo")


@dataclass
class LuffyOptions:
    """--algo luffy options (`cfg.luffy`)."""

    n_prefix: int = option(1, "rows per group guided by the demonstration (-1 = all)", ge=-1)
    prefix_strategy: Literal[PREFIX_STRATEGIES] = option(
        "random", "how guided rows' prefix ratios ρ (share of the demonstration given) are drawn: random = U(min, "
                  "max); fixed = evenly from min to max; linear = shrinking with the step; reverse_linear / "
                  "linear_max = windowed draws (algos.luffy.prefix)")
    min_prefix_ratio: float = option(1.0, "smallest prefix ratio ρ (1 = whole demonstration)", ge=0, le=1)
    max_prefix_ratio: float = option(1.0, "largest prefix ratio ρ", ge=0, le=1)
    prefix_steps: int = option(1000, "steps over which linear strategies move", gt=0)
    prefix_linear_max_ratio: float = option(0.8, "ρ at step 0 of the linear strategies", ge=0, le=1)
    prefix_share_across_samples: bool = option(False, "one ρ draw per group instead of one per row")
    estimator: Literal[LUFFY_ESTIMATORS] = option(
        "grpo_split", "grpo_split: group statistics from the on-policy rows only (the seed; the teacher row is not "
                      "part of what the policy samples); grpo: all rows, teacher included (the reference script)")
    use_std: bool = option(True, "divide by the group std (the seed's GRPO; the reference script uses false, i.e. "
                                 "Dr.GRPO-style centring only)")
    alpha: float = option(1.0, "advantage weight on prefix (off-policy) tokens")
    beta: float = option(1.0, "advantage weight on other tokens")
    off_policy_reshape: str = option("p_div_p_0.1", "no_reshape|logp|p_logp|square_root|pow|p_div_p_<γ>")
    off_policy_reshape_weight: float = option(0.1, "weight w of the logp / p_logp off-policy shapings")
    off_policy_reshape_pow_exp: float = option(0.5, "exponent of the pow off-policy shaping p^e")
    on_policy_reshape: str = option("no_reshape", "shaping of the on-policy ratio: no_reshape|logp|p_logp|"
                                                  "square_root|pow|p_div_p_<γ>")
    on_policy_reshape_weight: float = option(0.1, "weight w of the p_logp on-policy shaping")
    on_policy_reshape_pow_exp: float = option(0.5, "exponent of the pow on-policy shaping")
    off_max_clip: float | None = option(None, "upper clamp of the off-policy shaping f(p); null = off (the "
                                              "reference writes -1 for off; here -1 is a bound)")
    off_min_clip: float | None = option(None, "lower clamp of f(p); null = off (reference -1 = off)")
    remove_clip: bool = option(
        False, "drop the on-policy PPO clip (the reference script's loss_remove_clip=True). Only the on-policy clip "
               "exists to drop: demonstration tokens are never PPO-clipped, and no off-policy option (reshape, "
               "off_max_clip, off_min_clip) touches the on-policy clip")
    clip_upper_bound: float = option(1.0, "on-policy clip range upper end is max(this, 1 + loss.clip_high)")
    all_max_clip: float | None = option(
        None, "drop every response token (on- and off-policy) whose π_θ probability exceeds this; null = off (the "
              "reference writes -1 for off, rejected here: it would drop all tokens)", gt=0)
    use_target_probs: bool = option(False, "off-policy f = p/(teacher probability) instead of the reshape (needs a "
                                           "target_probs provider)")
    filter_extreme_groups: bool = option(True, "zero the advantage of all-0/all-1 groups (the buffer's "
                                               "filter=extreme drops them before training)")


def luffy_requirements(cfg: Any) -> frozenset[str]:
    """Spec "luffy" inputs: the teacher's token probabilities with use_target_probs, plus the KL term's."""
    extra = {"target_probs"} if cfg.luffy.use_target_probs else set()
    return kl_requirements(cfg) | frozenset(extra)


def luffy_problems(cfg: Any):
    """LUFFY's configuration rules (RunConfig.problems)."""
    lc, n = cfg.luffy, cfg.rollout.n
    if lc.n_prefix >= n and lc.estimator == "grpo_split":
        yield (f"luffy.n_prefix: {lc.n_prefix} guided rows leave no on-policy row in groups of rollout.n={n}, "
               f"so grpo_split has no baseline — set luffy.n_prefix < {n}")
    if lc.min_prefix_ratio > lc.max_prefix_ratio:
        yield "luffy.min_prefix_ratio: greater than luffy.max_prefix_ratio — swap them"
    if cfg.loss.ratio_level != "token":
        yield (f"loss.ratio_level: {cfg.loss.ratio_level} (GSPO) is not supported by luffy's mixed loss, whose "
               "on-policy ratio is reshaped per token — set loss.ratio_level=token")


register(AlgoSpec(
    name="luffy",
    summary="LUFFY: off-policy demonstration prefixes, grpo_split advantage, mixed on/off-policy loss with "
            "policy shaping f(p) = p/(p+γ)",
    maths="algos.luffy.maths:MATHS",
    options=LuffyOptions,
    requires=luffy_requirements,
    needs_demonstrations=True,
    guided_rows=True,
    validate=luffy_problems,
))
