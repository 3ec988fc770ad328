"""PURE's options, configuration rules and registration (torch-free; the maths is `algos.pure.maths` and
`algos.pure.steps`, the step scorer the learner's "process_rewards" provider, `learner.prm.pure`;
REFERENCE_NOTES §3, §7.7–7.10)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from algos.options import function_name, option
from algos.spec import PROX, AlgoSpec, kl_requirements, register

CREDITS = ("minform", "uniform", "strict", "gamma")
BASELINES = ("token", "step", "verl")
WHITEN_MODES = ("none", "batch", "pure_main")
KL_IN_REWARD = ("k1", "k3", "low_var_kl")
BUILTIN_PRMS = ("rule", "hf")


def _whiten_bool(value: Any) -> Any:
    """Backward compatibility: pure.whiten was a boolean (false = none, true = batch)."""
    return {False: "none", True: "batch"}.get(value, value) if isinstance(value, bool) else value


@dataclass
class PureOptions:
    """--algo pure options (`cfg.pure`)."""

    credit: Literal[CREDITS] = option(
        "minform", "credit assignment of step scores: minform = softmax(−p/T)-weighted, uniform = p/K, strict = "
                   "suffix minimum, gamma = γ-discounted sum (algos.pure.steps)")
    temperature: float = option(0.1, "min-form softmax temperature T", gt=0)
    gamma: float = option(1.0, "discount for credit=gamma", gt=0, le=1)
    c_pr: float = option(1.0, "process-reward coefficient")
    c_vr: float = option(1.0, "verifiable-reward (RLOO) coefficient")
    vr_fraction: float = option(
        1.0, "share of prompts (0–1) whose rows get the c_vr term; the others train on the process reward only. "
             "A prompt is in when a hash of its token ids and the run seed falls below it (algos.pure.maths."
             "vr_prompt), so it is in or out for the whole run. 1 = every prompt (today's behaviour); the PURE "
             "paper's PRM+VR arm uses 0.1", ge=0, le=1)
    baseline: Literal[BASELINES] = option(
        "token", "baseline of the process return: token (PURE-main scripts), step (PURE-main argparse default) or "
                 "verl (PURE-verl RLOO: the others' summed fused returns / ((n−1)·L) with L = "
                 "rollout.max_response_tokens, verl's padded width; replaces the RLOO of the outcome)")
    whiten: Literal[WHITEN_MODES] = option(
        "none", "advantage normalisation over the step's global batch: none; batch = Bessel whitening of the kept "
                "tokens (PURE-verl adv_norm, the boolean true); pure_main = PURE-main's buffer normaliser (zeroed "
                "tokens out of the count, in the variance). Default none, unlike both references, because "
                "ALGORITHMS.md makes whitening optional: both fused terms are already on the reward scale (step "
                "scores and outcomes in [−1, 1]), and one step's token statistics are noisy at small batches",
        before=_whiten_bool)
    zero_separators: bool = option(True, "zero the advantage at step separators (PURE-main default; PURE-verl "
                                         "zeroes nothing)")
    zero_final: bool = option(
        False, "also zero the final response token's advantage; PURE-main does (its separator mask includes the "
               "eos), off here because it removes the gradient of the answer/eos token, which the reference's own "
               "comment says it means to keep (REFERENCE_NOTES §7.10)")
    kl_coef: float = option(
        0.0, "KL-in-reward coefficient to a frozen reference (kl_estimator); both references use 0.001. Default 0 "
             "here: it needs a frozen reference model (memory and one more forward per step) and ALGORITHMS.md "
             "makes it optional; the PPO clip and buffer.max_staleness already bound the drift per step", ge=0)
    kl_estimator: Literal[KL_IN_REWARD] = option(
        "k1", "per-token KL of the KL-in-reward, d = log π_prox − log π_ref: k1 = d (PURE-main default); k3 = "
              "exp(−d) − 1 + d unclamped (PURE-main use_kl_estimator_k3); low_var_kl = k3 with d clamped to ±20 "
              "and the value to [−10, 10] (PURE-verl kl_penalty low_var_kl)")
    prm: str = option(
        "rule", "step scorer: rule = the synthetic task's step checker (data.task=arithmetic only); hf = an HF "
                "token-classification PRM at pure.prm_path; module:function or path/to/file.py:function = your "
                "own step scorer, called in the learner as fn(prompt, response, step_spans) -> one float (or None "
                "= unscored) per step, spans being (start, end) character offsets into response",
        after=lambda v: function_name(v, "pure.prm", BUILTIN_PRMS))
    prm_path: str | None = option(None, "HF PRM directory when prm=hf")


def pure_requirements(cfg: Any) -> frozenset[str]:
    """Spec "pure" inputs: the process-reward provider; ref log-probs for KL-in-reward or a KL loss (and
    π_prox before the update for KL-in-reward)."""
    extra = {"ref_logprobs", PROX} if cfg.pure.kl_coef > 0 else set()
    return frozenset({"process_rewards"}) | extra | kl_requirements(cfg)


def pure_problems(cfg: Any):
    """PURE's configuration rules (RunConfig.problems): the one owner of "pure.prm=hf needs pure.prm_path"."""
    pc = cfg.pure
    if pc.prm == "hf" and pc.prm_path is None:
        yield "pure.prm_path: pure.prm=hf needs a token-classification PRM directory — set pure.prm_path"
    if pc.prm == "rule" and cfg.data.task != "arithmetic":
        yield ("pure.prm: the rule step checker reads only the synthetic arithmetic task — with data.task=file "
               "use pure.prm=hf with pure.prm_path=DIR (an HF token-classification PRM), or "
               "pure.prm=module:function (your step scorer)")


def pure_files(cfg: Any):
    """The step scorer the learner will load: an HF PRM directory, or the user's function."""
    if cfg.pure.prm == "hf":
        yield "pure.prm_path", "hf_dir"
    elif cfg.pure.prm not in BUILTIN_PRMS:
        yield "pure.prm", "function"


register(AlgoSpec(
    name="pure",
    summary="PURE: min-form credit assignment of PRM step scores + RLOO on the verifiable reward, PPO clip",
    maths="algos.pure.maths:MATHS",
    options=PureOptions,
    requires=pure_requirements,
    validate=pure_problems,
    files=pure_files,
    path_keys=("pure.prm_path",),
))
