"""PRIME's options, configuration rules and registration (torch-free; the maths is `algos.prime.maths`,
`algos.prime.prm` and the learner's implicit-PRM provider, `learner.prm.prime`; REFERENCE_NOTES §2).

Reference defaults set outside this section (§2.7): loss.entropy_coef 0 (PRIME-orig script; the
PRIME-verl recipe uses 0.001), loss.dual_clip null (PRIME-orig has none; PRIME-verl's actor uses
c = 3), loss.kl_coef 0 (neither reference applies a KL). PRIME-verl's oversampling (oversample_factor
4, failing groups fill a short batch) is not a key: the buffer's accuracy_window filter waits for
passing groups instead (`tests/reference/prime.py` holds the reference rule), and its
truncation filter (`filter_truncate`) is not applied by the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from algos.options import option
from algos.spec import PROX, AlgoSpec, kl_requirements, register

GRANULARITIES = ("token", "whole")
NORMS = ("batch_norm", "batch_norm_local", "none")
PROCESS_BASELINES = ("seed", "reference")
UPDATES = ("single", "double")
REFS = ("freeze", "policy")
PRM_LOSSES = ("ce", "dpo", "bon_acc", "bon_rm")
PRM_UPDATES = ("online", "frozen")


@dataclass
class PrimeOptions:
    """--algo prime options (`cfg.prime`)."""

    beta: float = option(0.05, "implicit PRM β (both references 0.05): r_t = β q_t; also the PRM losses' β (PRIME "
                               "beta_train)", gt=0)
    raw_q: bool = option(False, "PRIME-orig: r_t = q_t (no β); default false = paper and PRIME-verl")
    lam: float = option(0.0, "λ of PRIME-verl's reward_model.lambda (default 0 = off, as PRIME-verl): r_t = "
                             "Σ_{k≥t} λ^{k−t} q'_k with q' = β q", ge=0, le=1)
    use_gt: bool = option(False, "PRIME-verl prime_use_gt (only with lam > 0, as there): the last token's q' "
                                 "becomes acc_i − Σ_{t<e_i} q'_t before the λ smoothing")
    granularity: Literal[GRANULARITIES] = option(
        "token", "token: reward on every response token (both references); whole: the row's total at its last "
                 "token (PRIME-orig; with lam > 0 the total of the smoothed rewards)")
    drop_last_token: bool = option(
        False, "PRIME-verl's token granularity: the last response token gets reward 0 (needs granularity=token); "
               "default false keeps it (PRIME-orig)")
    norm: Literal[NORMS] = option(
        "batch_norm", "batch_norm: divide by max |suffix sum| + 1e-6 over the global batch (both references take "
                      "it per rank: batch_norm_local)")
    norm_shards: int = option(1, "shards for batch_norm_local (normally the learner world size)", ge=1)
    c_gt: float = option(5.0, "outcome (verifier) coefficient (PRIME-verl reward_gt_coef 5; PRIME-orig uses 1, the "
                              "same under whitening)")
    c_pr: float = option(5.0, "process (implicit PRM) coefficient (PRIME-verl reward_dpo_coef 5; PRIME-orig uses 1, "
                              "the same under whitening)")
    gamma: float = option(1.0, "discount of process returns", gt=0, le=1)
    outcome_gamma: float = option(1.0, "discount of the outcome return (PRIME-orig's verifier γ)", gt=0, le=1)
    whiten: bool = option(True, "whiten the fused returns over the global batch (both references)")
    process_baseline: Literal[PROCESS_BASELINES] = option(
        "seed", "seed: true leave-one-out process baseline (ALGORITHMS.md); reference: both references' "
                "(n·x − Σ_j m_j)/(n − 1), which is not leave-one-out (§7.1)")
    update: Literal[UPDATES] = option(
        "single", "single (default; PRIME-orig after, its only working mode, one PRM forward): rewards from the "
                  "forward that gives the PRM loss, before the PRM step; double (PRIME-verl's recipe default "
                  "before): step, then re-score with one more forward")
    ref: Literal[REFS] = option(
        "freeze", "the implicit PRM's reference π_ref in q = log π_φ − log π_ref: freeze = the initial policy (a "
                  "frozen copy), policy = the batch's π_prox")
    prm_lr: float = option(1e-6, "PRM AdamW learning rate", gt=0)
    prm_grad_clip: float = option(10.0, "max global grad norm of the PRM optimiser step", gt=0)
    prm_loss: Literal[PRM_LOSSES] = option(
        "ce", "PRM loss (PRIME-verl loss_type): ce = BCE(σ(β Σq), acc) (both references); dpo, bon_acc, bon_rm = "
              "detached DPO against the group's scores from an extra no-grad forward before the update "
              "(PRIME-verl update=reverse), BoN-weighted for bon_*; per-row losses summed and divided by the "
              "step's rows")
    prm_update: Literal[PRM_UPDATES] = option(
        "online", "online (default; PRIME's method): one PRM optimiser step per learner step; frozen (the PRIME "
                  "paper's offline-PRM arm, §5.3): online for the first prime.prm_frozen_after learner steps, "
                  "then no PRM optimiser step: q comes from a no-grad forward of the PRM as it was then, "
                  "prime/prm_version stops and prime/prm_loss is the frozen PRM's CE on the step's rows (needs "
                  "prm_loss=ce, update=single). With prm_frozen_after=0 and ref=freeze the PRM is the reference "
                  "itself, so q ≡ 0: the paper's frozen PRM was trained before RL, which the warm-up stands for")
    prm_frozen_after: int = option(
        0, "with prm_update=frozen: learner steps (0-based step index) of online PRM updates before it freezes; a "
           "frozen arm and an online arm with the same seed share these steps", ge=0)


def prime_requirements(cfg: Any) -> frozenset[str]:
    """StepBatch inputs of spec "prime": the implicit-PRM provider's q, plus ref log-probs for a KL loss
    (and π_prox before the update when it is the PRM's reference, prime.ref = policy)."""
    prox = {PROX} if cfg.prime.ref == "policy" else set()
    return frozenset({"prime_q"} | prox) | kl_requirements(cfg)


def prime_problems(cfg: Any):
    """PRIME's configuration rules (RunConfig.problems)."""
    if cfg.buffer.filter != "accuracy_window":
        yield ("buffer.filter: PRIME trains on groups inside the accuracy window — set "
               "buffer.filter=accuracy_window (bounds buffer.acc_lo/acc_hi)")
    r = cfg.rollout
    if cfg.prime.ref == "policy" and (r.top_p < 1 or r.top_k > 0):
        yield ("prime.ref: 'policy' compares the PRM's untruncated log-probs with π_prox, which top-p/top-k "
               "truncate (rollout.top_p < 1 or rollout.top_k > 0) — use prime.ref=freeze or sample without "
               "truncation")
    if cfg.prime.drop_last_token and cfg.prime.granularity == "whole":
        yield ("prime.drop_last_token: with prime.granularity=whole the whole reward sits on the last token and "
               "would be dropped — set prime.granularity=token or prime.drop_last_token=false")
    if cfg.prime.prm_update == "frozen" and (cfg.prime.prm_loss != "ce" or cfg.prime.update != "single"):
        yield ("prime.prm_update: a frozen PRM takes no update step, so prime.prm_loss and prime.update only name "
               "what it would log — set prime.prm_loss=ce and prime.update=single with prime.prm_update=frozen")


register(AlgoSpec(
    name="prime",
    summary="PRIME: implicit PRM process rewards + RLOO on process and outcome rewards, PPO clip",
    maths="algos.prime.maths:MATHS",
    options=PrimeOptions,
    requires=prime_requirements,
    validate=prime_problems,
))
