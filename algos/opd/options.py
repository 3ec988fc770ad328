"""On-policy distillation's options, configuration rules and registration (torch-free; the maths is
`algos.opd.maths`; docs/algorithms.md "On-policy distillation" says where each default comes from).

The teacher is the run's `teacher:` section (`configs.teacher_section`), not an option of this algorithm: its
log-probs reach the advantage as the provider input `teacher_logprobs` (`learner.providers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from algos.options import option
from algos.spec import PROX, TEACHER, AlgoSpec, kl_requirements, register

STUDENT_TERMS = ("prox", "behaviour")
REWARD_ESTIMATORS = ("grpo", "rloo")


@dataclass
class OPDOptions:
    """--algo opd options (`cfg.opd`)."""

    kl_coef: float = option(
        1.0, "λ: the reverse-KL advantage of a response token is −λ·(log π_student − log π_teacher) (Tinker's "
             "kl_penalty_coef and slime's --opd-kl-coef, both 1)", ge=0)
    student: Literal[STUDENT_TERMS] = option(
        "prox", "which log π_student the advantage subtracts: prox = the learner's π_prox, recomputed at the step "
                "(the policy being updated; slime's default, prime-rl's trainer log-probs); behaviour = μ, the "
                "sampler's log-probs (Tinker, slime --use-rollout-logprobs), as stale as the row")
    discount: float = option(
        0.0, "γ: the reverse-KL advantage of token t becomes Σ_{k≥t} γ^(k−t)·(its value at k) over the response "
             "(0 = each token's own; Tinker's kl_discount_factor, default 0)", ge=0, le=1)
    reward_coef: float = option(
        0.0, "c: c × the verifiable reward's group advantage is added to every response token (0 = distillation "
             "alone, as Tinker and prime-rl; slime adds its estimator's advantage, c = 1)", ge=0)
    reward_estimator: Literal[REWARD_ESTIMATORS] = option(
        "grpo", "group baseline of the reward term (reward_coef > 0): grpo = (r − mean)/(std + 1e-6), rloo = "
                "r − mean of the others")
    use_std: bool = option(True, "grpo reward term: divide by the group std (false = Dr.GRPO centring only)")


def opd_requirements(cfg: Any) -> frozenset[str]:
    """Spec "opd" inputs: the teacher's log-probs, π_prox before the update (opd.student=prox), the KL term's."""
    prox = {PROX} if cfg.opd.student == "prox" else set()
    return kl_requirements(cfg) | frozenset({TEACHER, *prox})


def opd_problems(cfg: Any):
    """On-policy distillation's configuration rules (RunConfig.problems)."""
    oc = cfg.opd  # a missing teacher.path is preflight's to refuse (`launch.prep.teacher_check`): --dry-run shows it
    if oc.kl_coef == 0 and oc.reward_coef == 0:
        yield "opd.kl_coef: 0 with opd.reward_coef 0 leaves no advantage — set opd.kl_coef > 0 (e.g. 1)"
    if oc.reward_coef > 0 and cfg.rollout.n < 2:
        yield (f"rollout.n: the reward term (opd.reward_coef={oc.reward_coef:g}) compares each sample with its "
               f"group, which a group of {cfg.rollout.n} does not have — set rollout.n ≥ 2 or opd.reward_coef=0")


register(AlgoSpec(
    name="opd",
    summary="on-policy distillation: per-token reverse KL to a frozen teacher (teacher.path) as the advantage, "
            "PPO clip, optionally plus the reward's group advantage",
    maths="algos.opd.maths:MATHS",
    options=OPDOptions,
    requires=opd_requirements,
    min_group_size=1,  # the distillation signal is per token; opd_problems asks for groups when the reward term is on
    validate=opd_problems,
))
