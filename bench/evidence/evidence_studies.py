"""The evidence studies' arms, overrides and testbed starts (bench/evidence/evidence.py runs and analyses them; its
docstring says what each study is for)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bench.common.runs import log


@dataclass(frozen=True)
class Arm:
    name: str
    algo: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    claim: str  # what the paper reports, to set ours beside
    arms: tuple[Arm, ...]
    steps: int  # learner steps per run (every config here consumes 64 samples a step)
    eval_every: int
    baseline: str  # arm the others are compared with, seed by seed
    common: tuple[str, ...] = ()
    threshold: float = 0.10  # gain over the run's own start that counts as "reached"
    # start from the tiny model warmed up (SFT) under these overrides of the grpo config, not on the run's
    # own task (None: each run warms up as its config says)
    warm_start: tuple[str, ...] | None = None
    # run on this built-in testbed (configs/testbeds/<name>.yaml, launch.prep.testbed): every seed starts from
    # seed 0's warm model (and PURE arms score with seed 0's PRM), so the seeds vary the RL run only
    testbed: str | None = None
    # per-step training metrics drawn and tabulated over training (bench/evidence/evidence_traces.py)
    traces: tuple[str, ...] = ()
    # no runs of its own: it reads these arms' runs of the study named here
    source: str | None = None
    # the test and the verdict rule fixed before the first run, and the settings that differ from the paper
    registered: str = ""
    # arm -> the seeds whose runs had not been seen when the test was registered (only for a test registered
    # after some runs: its verdict is also reported on these alone)
    unseen: tuple[tuple[str, tuple[int, ...]], ...] = ()
    seeds: int = 3  # the seeds its registration names, 0 ... seeds - 1: its verdict needs every arm on all of them


WEAK_SFT_STEPS = 60  # greedy held-out accuracy 0.000-0.005 on seeds 0-2 (bench/RESULTS.md, "LUFFY")
MINI = ("learner.mini_batches=4", "learner.epochs=2", "learner.lr=3e-5")

STEPS_DENSE = Study("steps-dense", "Dense rewards on the testbed: PURE (min-form, learned PRM) and PRIME against RLOO",
                    "PRIME (Cui et al. 2025, §4.4): outcome-only RLOO's final training reward in 40% of the steps (2.5x the "
                    "sample efficiency); PURE (Cheng et al. 2025, §4.3 Fig. 2b): PRM+VR runs reach the VR-only run's "
                    "accuracy in ~30% of the steps",
                    (Arm("rloo", "rloo"), Arm("pure-min", "pure"), Arm("prime", "prime")),
                    steps=80, eval_every=10, baseline="rloo", testbed="steps",
                    traces=("accuracy/train", "prime/prm_loss", "prime/dpo_acc", "pure/prm_step_acc", "pure/prm_pair_acc"))

STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("luffy", "LUFFY against GRPO from a weak start",
          "LUFFY (Yan et al. 2025): off-policy guidance lets the model learn where its own rollouts almost never "
          "succeed; on-policy RL stays near flat there",
          (Arm("grpo", "grpo"), Arm("luffy", "luffy")), steps=150, eval_every=10, baseline="grpo",
          common=(f"model.sft_warmup_steps={WEAK_SFT_STEPS}",), threshold=0.05),
    Study("luffy-beyond", "LUFFY against GRPO on a task beyond the model (2-digit warm-up, 3-digit task)",
          "LUFFY (Yan et al. 2025): off-policy guidance lets the model learn where its own rollouts almost never "
          "succeed; on-policy RL stays near flat there",
          (Arm("grpo", "grpo"), Arm("luffy", "luffy")), steps=150, eval_every=10, baseline="grpo",
          common=("data.arithmetic.min_digits=3", "data.arithmetic.max_digits=3"), threshold=0.05, warm_start=()),
    Study("dense", "Dense rewards: PURE and PRIME against outcome-only RLOO",
          "PRIME (Cui et al. 2025): 2.5x the sample efficiency of outcome-only RLOO; PURE (Cheng et al. 2025): "
          "min-form credit assignment avoids the reward hacking that sum-form credit suffers",
          (Arm("rloo", "rloo"), Arm("pure-min", "pure"), Arm("pure-sum", "pure", ("pure.credit=gamma", "pure.gamma=1.0")),
           Arm("prime", "prime")), steps=100, eval_every=10, baseline="rloo"),
    Study("pacs", "PACS against GRPO",
          "PACS (Li et al. 2025): reframing RLVR as supervised learning of a score (BCE on β·log-ratio) beats "
          "PPO/GRPO at equal samples",
          (Arm("grpo", "grpo"), Arm("pacs-question", "pacs"),
           *(Arm(f"pacs-{m.replace('_', '-')}", "pacs", (f"pacs.weight_mode={m}",))
             for m in ("only_positive", "only_negative", "none"))),
          steps=100, eval_every=10, baseline="grpo"),
    Study("steps-hacking", "PURE sum-form against min-form credit, PRM-only reward from a learned PRM (testbed)",
          "PURE (Cheng et al. 2025, §4.3 Fig. 2a): with a learned PRM and no verifiable reward, sum-form credit "
          "collapses early (PRM reward keeps rising while accuracy falls; responses of few or no real steps); "
          "min-form stays stable far longer",
          (Arm("pure-min", "pure"), Arm("pure-sum", "pure", ("pure.credit=gamma", "pure.gamma=1.0"))),
          steps=80, eval_every=10, baseline="pure-min", common=("pure.c_vr=0.0",), testbed="steps",
          traces=("accuracy/train", "pure/process_return", "pure/min_step_score", "response/length_mean",
                  "pure/num_steps", "pure/prm_step_acc")),
    STEPS_DENSE,
    replace(STEPS_DENSE, name="steps-prm-drift",
            title="A fixed PRM against PRIME's online implicit PRM on the policy's own rollouts (testbed)",
            claim="PRIME (Cui et al. 2025, §5.1 Figs. 5-6): an offline PRM starts accurate and loses accuracy on "
                  "the policy's rollouts as the policy moves; the online implicit PRM starts lower and gains it",
            arms=STEPS_DENSE.arms[1:], baseline="pure-min", source=STEPS_DENSE.name,
            traces=("pure/prm_pair_acc", "prime/dpo_acc", "pure/prm_step_acc")),
    Study("steps-prm-frozen", "PRIME's implicit PRM updated online against the same PRM frozen after 10 steps (testbed)",
          "PRIME (Cui et al. 2025, §5.1 Figs. 5-6; §5.3): a PRM that is not updated loses accuracy on the policy's "
          "rollouts as the policy moves, while the online implicit PRM keeps or gains it",
          (Arm("prime-online", "prime"),
           Arm("prime-frozen", "prime", ("prime.prm_update=frozen", "prime.prm_frozen_after=10"))),
          steps=80, eval_every=10, baseline="prime-online", testbed="steps", seeds=5,
          traces=("prime/dpo_acc", "prime/dpo_abs_acc", "prime/prm_ce_eval", "accuracy/train"),
          registered="Registered 2026-11-28 before any run (issue 43). Test: per seed, the change of `prime/dpo_acc` "
                     "(the paper's pairwise metric, on the step's own rollouts, before the PRM's update) from the "
                     "first window (steps 1-10, where both arms are the same online PRM) to the last (steps 71-80); "
                     "Δ = change(online) − change(frozen), paired over 5 seeds, two-sided t with df = 4 "
                     "(bench.common.stats). Verdict words by bench.common.stats.verdict: reproduced if Δ > 0 with "
                     "p < 0.05; direction only if Δ > 0 with p ≥ 0.05; not reproduced if p ≥ 0.05 and the "
                     "detectable effect (3.72 × SE at 5 seeds) is below 0.05; inconclusive otherwise. Differs from the "
                     "paper: the same kind of PRM in both arms, as the audit asks (the paper's offline PRM was "
                     "Qwen-PRM-style, trained beforehand; here 10 online steps stand for its training); a 4-layer "
                     "model on 4-5 digit arithmetic, 80 steps × 64 samples, not 7B on competition math; the metric "
                     "is read on groups the accuracy window kept (every group has both outcomes)."),
    Study("steps-luffy-beyond", "LUFFY against GRPO on the testbed's level beyond the warm model (7-8 digits)",
          "LUFFY (Yan et al. 2025, §5.2 Fig. 4): off-policy guidance lets the model learn where its own rollouts "
          "never succeed; on-policy RL's training reward stays at zero there",
          (Arm("grpo", "grpo"), Arm("luffy", "luffy")), steps=100, eval_every=10, baseline="grpo",
          common=("data.arithmetic.level=steps-hard",), threshold=0.05, testbed="steps",
          traces=("accuracy/train", "luffy/reward_onpolicy", "luffy/off_policy_prob", "entropy",
                  "response/length_mean")),
    Study("steps-pacs", "PACS against GRPO on the testbed, both at 4 optimiser steps per RL step",
          "PACS (Li et al. 2025, v2 Table 2, Fig. 5): beats GRPO at equal samples (most at large-k pass@k) and "
          "keeps the policy's entropy where GRPO's collapses",
          (Arm("grpo", "grpo", ("learner.mini_batches=4",)), Arm("pacs", "pacs")), steps=80, eval_every=10,
          baseline="grpo", testbed="steps", traces=("accuracy/train", "entropy", "response/length_mean")),
    Study("staleness", "Staleness K and the correction, with a trust region that acts",
          "AReaL (Fu et al. 2025): naive PPO collapses at staleness 4 while the decoupled objective holds up to 8",
          (Arm("K0", "grpo", ("buffer.max_staleness=0", "loss.is_correction=tis")),
           *(Arm(f"K{k}-{c}", "grpo", (f"buffer.max_staleness={k}", f"loss.is_correction={c}"))
             for k in (2, 8, 16) for c in ("none", "tis", "decoupled"))),
          steps=40, eval_every=10, baseline="K0", common=MINI),
)}
COST_FROM = ("dense", "pacs")


def run_overrides(study: Study, arm: Arm, seed: int) -> list[str]:
    return [*warm_model(study, seed), *testbed_start(study, arm), *teacher_model(study, arm), *study.common,
            *arm.overrides, f"seed={seed}", f"learner.steps={study.steps}", f"learner.eval_every={study.eval_every}"]


def config_file(study: Study) -> str | None:
    """The --config file of the study's runs: its testbed's yaml (None: configs/<algo>.yaml alone)."""
    from launch.prep.testbed import yaml_of_testbed

    return str(yaml_of_testbed(study.testbed)) if study.testbed else None


def testbed_start(study: Study, arm: Arm, build: bool = False) -> list[str]:
    """The testbed's `model.path=` (and PURE's `pure.prm=hf pure.prm_path=`) of seed 0, whatever the run's seed;
    with `build`, built first unless cached (launch.prep.testbed)."""
    if study.testbed is None:
        return []
    from launch.prep.testbed import build_testbed, testbed_sets

    args = (study.testbed, arm.algo, None, {}, [*study.common, *arm.overrides, "seed=0"])
    if build:
        build_testbed(study.testbed, arm.algo, {}, args[-1], log=log)
    return testbed_sets(*args)


def warm_model(study: Study, seed: int) -> list[str]:
    """`model.path=` the study's warm start for `seed` (built and cached by `launch.prep.model_prep` if missing)."""
    if study.warm_start is None:
        return []
    from configs.loading import resolve
    from launch.prep.model_prep import prepare_model

    cfg = resolve("grpo", overrides=[*study.warm_start, f"seed={seed}"])
    return [f"model.path={prepare_model(cfg, log=log).resolve()}"]


def teacher_runs(study: Study) -> list[Path]:
    """The teacher runs of a study with a teacher (TEACHER_RUNS), in order: stage 1 trains the testbed's warm model
    further by GRPO (seed 0), each later stage the export of the one before, in .cache/models/evidence-teachers/
    <study> (stage 1) and <study>-<k> (stage k); shared by every seed. [] for other studies. Under model.cache_dir
    (.cache/models), so that a stage started from an export is the built-in model to `configs.presets` and keeps
    the testbed's values (elsewhere it would count as a user's model and get lr 1e-6)."""
    from bench.common.runs import ROOT

    base = ROOT / ".cache" / "models" / "evidence-teachers"
    return [base / (study.name if k == 1 else f"{study.name}-{k}")
            for k in range(1, len(TEACHER_RUNS.get(study.name, ())) + 1)]


def _export(run_dir: Path, steps: int) -> Path:
    return run_dir / "hf" / f"step_{steps}"


def teacher_model(study: Study, arm: Arm) -> list[str]:
    """`teacher.path=` (the last teacher stage's last export) of a distillation arm; [] for every other arm."""
    runs = teacher_runs(study)
    if not runs or arm.algo != "opd":
        return []
    return [f"teacher.path={_export(runs[-1], TEACHER_RUNS[study.name][-1])}"]


def build_teacher(study: Study) -> None:
    """Run the study's teacher stages once each (a finished one is reused) and report its held-out accuracy at the
    end against TEACHER_MIN_ACC; below it the study runs with TEACHER_BELOW's caveat (its registration)."""
    runs = teacher_runs(study)
    if not runs:
        return
    import json

    from bench.common.runs import finished, run_algo_train

    start: list[str] = []
    for k, (run_dir, steps) in enumerate(zip(runs, TEACHER_RUNS[study.name]), 1):
        if not finished(run_dir):
            overrides = [*testbed_start(study, Arm("teacher", "grpo"), build=True), *start, "seed=0",
                         f"learner.steps={steps}", "learner.eval_every=25"]
            res = run_algo_train(f"{study.name}/teacher-{k}", "grpo", run_dir, overrides,
                                 run_dir.with_suffix(".log"), config=config_file(study))
            if not res.ok:
                raise SystemExit(f"teacher stage {k} of {study.name} failed: {res.error} (log {res.log})")
        start = [f"model.path={_export(run_dir, steps)}"]
    acc = json.loads((runs[-1] / "summary.json").read_text())["final_eval_accuracy"]
    if acc is None:
        raise SystemExit(f"{study.name}: its teacher ({runs[-1]}) has no held-out accuracy: the study is not run")
    log(f"[{study.name}] teacher {runs[-1]}: held-out accuracy {acc:.3f}"
        + ("" if acc >= TEACHER_MIN_ACC else f", below the issue's {TEACHER_MIN_ACC}: {TEACHER_BELOW}"))


# ---- issue 40: on-policy distillation against RL, pre-registered 2026-11-29 before any run (teacher or study)
# Re-registered 2026-11-29 06:45 UTC, before any study run: the first registration's teacher (300 GRPO steps from
# the warm model, commit 0d434c7) ended at held-out 0.685, below its required 0.8, so that study did not run. The
# teacher now trains in two stages of 300 GRPO steps each (the second from the first's export, same settings);
# the study runs whatever stage 2 reaches, and below 0.8 says so beside its verdict (TEACHER_BELOW).
TEACHER_RUNS = {"steps-opd": (300, 300)}  # study -> GRPO steps of each teacher stage (from the testbed's warm model)
TEACHER_MIN_ACC = 0.8  # the issue's teacher: >= 0.8 held-out
TEACHER_BELOW = ("the study runs and its verdict is reported as a test against a teacher weaker than the issue's "
                 "(a weaker teacher caps what distillation can reach: it can only make 'reproduced' harder)")
STEPS_OPD = Study(
    "steps-opd", "On-policy distillation (reverse KL to a stronger teacher) against GRPO at equal samples (testbed)",
    "The Qwen3 technical report (Yang et al. 2025) and 'On-Policy Distillation' (Lu and Thinking Machines Lab, "
    "2025): a student distilled on its own samples from a stronger teacher reaches what RL reaches in a small "
    "fraction of RL's samples or compute",
    (Arm("grpo", "grpo"), Arm("opd", "opd")),
    steps=80, eval_every=5, baseline="grpo", testbed="steps",
    traces=("opd/reverse_kl", "accuracy/train", "response/length_mean"),
    registered="Registered 2026-11-29 before any run (issue 40 item 4); re-registered 2026-11-29 06:45 UTC, still "
               "before any study run, after the first teacher (300 GRPO steps) ended at held-out 0.685, below the "
               "required 0.8. Student: the testbed's warm model (held-out 0.34); teacher: the warm model after two "
               "stages of 300 GRPO steps (seed 0; stage 2 starts from stage 1's export with the same settings), run "
               "once by the study (bench/evidence/evidence_studies.py:build_teacher). If it ends below 0.8 the "
               "study still runs and the verdict names the teacher's accuracy. Both arms 80 steps x 64 samples from "
               "the same warm model, seeds 0-2 (the issue's 3). "
               "Test: per seed, S = the samples OPD needs to reach that seed's GRPO final held-out accuracy (the "
               "table's 'samples to grpo's end'), against GRPO's 5,120. Verdict: reproduced if S <= 2,560 (half "
               "of RL's samples) on all 3 seeds; direction only if S < 5,120 on all 3 but not all within half; "
               "not reproduced if OPD does not reach GRPO's end within 5,120 on any seed; inconclusive otherwise. "
               "Reported beside it, not tested: the paired final-accuracy difference (t, df = 2), accuracy at "
               "equal training seconds, and the reverse-KL curve. Differs from the papers: a 4-layer model on "
               "4-5 digit arithmetic, a teacher trained from the student's own start (same tokenizer and "
               "family), reward-free distillation (opd.reward_coef 0), 80 steps."
)
STUDIES[STEPS_OPD.name] = STEPS_OPD


# ---- issue 43: the papers' comparisons, pre-registered (settings fixed before any run; not changed after a
# result). Five seeds each (`--seeds 0 1 2 3 4`). Every study below names its precondition; `differs` says
# which settings differ from its paper and why. A precondition that fails its pre-check means the study is
# not run as registered (a new registration, committed before its runs, replaces it).
#
# Re-registered 2026-11-29 10:00 UTC, before any run of steps-credit, steps-luffy-beyond5 or steps-pacs5: their
# first registration (commit 64faf93) trained on 6-digit +/-, where the warm model answers 0 of 4,096 samples
# (bench/evidence/level_precheck.py, RESULTS "Level pre-checks"), so none of the three could run as registered.
# Each now trains on a level its pre-check passed (figures in PRECONDITION), chosen among the digit ranges
# 3-5, 4-5, 4-6, 5, 5-6 by that pre-check alone, before any of its runs.
def level(lo: int, hi: int) -> tuple[str, ...]:
    """Overrides of a +/- level of `lo`-`hi` digit operands (each operand's digits drawn uniformly)."""
    return ("data.arithmetic.level=null", f"data.arithmetic.min_digits={lo}", f"data.arithmetic.max_digits={hi}")


CREDIT_LEVEL = level(4, 5)  # the testbed's own level (steps-main): sampled train accuracy 0.081
BEYOND_LEVEL = level(5, 6)  # held-out pass@8 0.007: one column past on 3 of 4 problems
PACS_LEVEL = level(5, 5)  # held-out pass@64 0.44, pass@1 0.021
FILTERED = ("buffer.filter=accuracy_window", "buffer.acc_lo=0.2", "buffer.acc_hi=0.8")
BIASED_PRM = "pure.prm=bench/evidence/prm_rules.py:biased_steps"
PRM_ONLY = ("pure.c_vr=0.0", "learner.lr=5e-5")  # the PURE paper halves the lr of its PRM-only runs
MIXED = ("pure.c_vr=1.0", "pure.vr_fraction=0.1")
SUM = ("pure.credit=gamma", "pure.gamma=1.0")
CONSTANT_LR = ("learner.lr_schedule=constant", "learner.warmup_steps=0")
# the LUFFY paper's reference recipe (REFERENCE_NOTES §4; the audit's item 3): group statistics over every row,
# the teacher's included; centring without the std; no PPO clip on on-policy tokens
LUFFY_PAPER = ("luffy.estimator=grpo", "luffy.use_std=false", "luffy.remove_clip=true")

DIFFERS: dict[str, str] = {
    "steps-credit": "tiny 4-layer model on the testbed's own 4-5 digit +/− (the paper: Qwen2.5-Math-7B on "
                    "competition maths); its sampled train accuracy at the start is 0.081, a little sparser than "
                    "the paper's 0.10-0.15, which no level of this warm model gives (3-5 digits 0.037, 4-6 "
                    "0.010, 5-6 0.001); 200 steps × 64 trained samples (the paper: ~600 steps × 256); PRIME's "
                    "PRM lr at the tiny model's scale, two values (2e-4 = the shipped 2× policy lr; 1e-3, where "
                    "an earlier study's prime/dpo_acc held 0.56-0.61, as the audit proposes) since no single "
                    "value transfers (amended 2026-11-29 10:02 UTC before any run: 1e-3 for the first "
                    "registration's 5e-5); PURE with the exact rule PRM (the paper: a "
                    "learned PRM) as the dense-credit arm with a PRM that cannot be wrong",
    "steps-hacking-pure": "a biased rule PRM (bench/evidence/prm_rules.py) stands for the paper's learned PRM: "
                          "controlled bias (no-claim steps +0.3, a boxless last step −0.5), deterministic, so the "
                          "paper's several PRM seeds become one PRM; 80 steps (the paper: collapse within ~100)",
    "steps-luffy-beyond5": "5-6 digit +/− (operands of 5 or 6 digits: one column past the warm model's 4-5 on "
                           "3 problems in 4) for a held-out pass@8 of 0-0.05 (the paper: hard maths for a weak "
                           "model; 6 digits alone gave 0); teacher rows from the task's references, not a "
                           "stronger model's; a 4-layer model, 250 steps × 64 samples",
    "steps-pacs5": "tiny model, lr 2.5e-5 at 4 optimiser steps per RL step in both arms (lower than the shipped "
                   "1e-4, where both arms dipped); 5-digit operands only, so the warm model's pass@64 is 0.44 "
                   "(< 0.9, and > 0: 6 digits gave 0, nothing to learn from); 250 steps × 64 samples",
}
PRECONDITION: dict[str, str] = {
    "steps-credit": "RLOO-arm train accuracy at the start in the sparse regime, re-registered as 0.05-0.15 (the "
                    "first registration's 0.10-0.15 is reached by no level of this warm model: DIFFERS): PASS at "
                    "4-5 digits, 0.081 (the warm model's sampled accuracy on 64 train prompts × 16 samples; "
                    "the study's first RLOO steps will show it again)",
    "steps-hacking-pure": "the biased PRM orders a group's right and wrong answers better than chance and scores a "
                          "bare fragment below a correct step (bench/evidence/prm_precheck.py)",
    "steps-luffy-beyond5": "warm model's held-out pass@8 in (0, 0.05]: PASS at 5-6 digits, 0.0074 (32 held-out "
                           "prompts × 64 samples at temperature 1; pass@64 0.031)",
    "steps-pacs5": "warm model's pass@64 < 0.9 on the level: PASS at 5 digits, 0.44 (32 held-out prompts × 64 "
                   "samples; pass@1 0.021); and GRPO's response-token entropy falls over the run (read from "
                   "the study's own GRPO runs: mean `entropy` of steps 226-250 below that of steps 1-25 on at "
                   "least 4 of 5 seeds; otherwise the verdict is inconclusive, whatever the test says)",
}

ISSUE43 = (
    Study("steps-credit", "Dense credit in the sparse regime: PRIME (two PRM lrs) and PURE (exact rule PRM) "
          "against the paper's RLOO (n = 4, accuracy filter)",
          "PRIME (Cui et al. 2025, §4.4 Fig. 4): outcome-only RLOO's final training accuracy (on all generated "
          "rollouts, before the filter) in 40% of the steps, 2.5x the sample efficiency",
          (Arm("rloo", "rloo", ("rollout.n=4", "learner.batch_prompts=16", *FILTERED)),
           Arm("prime-prm2e-4", "prime", ("prime.prm_lr=2e-4",)),
           Arm("prime-prm1e-3", "prime", ("prime.prm_lr=1e-3",)),
           Arm("pure-rule", "pure", ("pure.prm=rule", *FILTERED))),
          steps=200, eval_every=10, baseline="rloo", common=CREDIT_LEVEL, testbed="steps", seeds=5,
          traces=("accuracy/train", "buffer/generated_samples", "buffer/generated_correct", "prime/dpo_acc"),
          registered="Re-registered 2026-11-29 10:00 UTC before any run (the 6-digit registration of 64faf93 "
                     "failed its pre-check). Four arms from the testbed's warm model, 200 steps × 64 trained "
                     "samples each, seeds 0-4. The paper's metric: training accuracy on all generated rollouts "
                     "before the filter, over a window of 20 steps, = Δ buffer/generated_correct / Δ "
                     "buffer/generated_samples. Test, per dense arm (prime-prm2e-4, prime-prm1e-3, pure-rule) "
                     "and seed: target = RLOO's metric over its steps 181-200; S = the arm's "
                     "buffer/generated_samples at the first step t ≥ 20 whose window (t-19 ... t) reaches the "
                     "target; N = RLOO's buffer/generated_samples at step 200. Verdict per arm: reproduced if "
                     "S ≤ N/2 on all 5 seeds (the paper: 0.4 N); direction only if S < N on all 5 but not all "
                     "within half; not reproduced if the arm reaches the target on no seed; inconclusive "
                     "otherwise. Reported beside it, not tested: the paired final held-out greedy accuracy, arm "
                     "− RLOO (paired_accuracy_delta, df = 4), each arm's metric curve against generated samples, "
                     "and RLOO's accuracy over its first 10 steps (the precondition seen in the runs)."),
    Study("steps-hacking-pure", "PURE hacking: {sum, min} × {PRM only, PRM + VR on 10% of prompts} and a verifier-"
          "only control, with a biased rule PRM",
          "PURE (Cheng et al. 2025, §4.3 Fig. 2): PRM-only sum-form collapses early (PRM reward up, accuracy "
          "down, few real steps); min-form lasts longer; VR on 10% of prompts holds both off",
          (Arm("vr-only", "pure", ("pure.c_pr=0.0", "pure.c_vr=1.0")),
           Arm("min-prm", "pure", PRM_ONLY), Arm("sum-prm", "pure", (*SUM, *PRM_ONLY)),
           Arm("min-mix", "pure", MIXED), Arm("sum-mix", "pure", (*SUM, *MIXED))),
          steps=80, eval_every=5, baseline="min-prm", testbed="steps", seeds=5,
          common=(BIASED_PRM, "pure.kl_coef=1e-3", "pure.whiten=batch"),
          traces=("accuracy/train", "pure/process_return", "pure/min_step_score", "response/length_mean",
                  "pure/num_steps", "pure/prm_step_acc"),
          registered="Settings registered in 64faf93 before any run. The test was not registered then; it is "
                     "registered here, 2026-11-29 07:05 UTC, after 12 of the 25 runs had finished and been seen "
                     "(every arm of seeds 0-1; vr-only and min-prm of seed 2) and before the other 13. "
                     "T1 (the paper's headline, sum-form PRM-only collapses where min-form does not): "
                     "Δ1 = final held-out accuracy of sum-prm − min-prm, paired over seeds 0-4 "
                     "(bench.common.stats.paired_accuracy_delta, df = 4), paper's sign −1. T2 (10 % verifiable "
                     "reward holds the sum form off): Δ2 = sum-mix − sum-prm, paired, df = 4, paper's sign +1. "
                     "Verdict words by bench.common.stats.verdict with matters = 0.10 (a quarter of the "
                     "paper's collapse, which takes accuracy to ~0: here a collapse would be 0.34 → < 0.17). "
                     "Reported beside, not tested: collapses per arm (first evaluation at ≤ ½ the start), the "
                     "change of pure/process_return against accuracy, a per-prompt paired bootstrap of the "
                     "final models pooled over seeds, and T1/T2 on the seeds not seen when this was written.",
          unseen=(("vr-only", (3, 4)), ("min-prm", (3, 4)), ("sum-prm", (2, 3, 4)), ("min-mix", (2, 3, 4)),
                  ("sum-mix", (2, 3, 4)))),
    Study("steps-luffy-beyond5", "LUFFY against GRPO one column past the warm model, constant lr, 250 steps",
          "LUFFY (Yan et al. 2025, §5.2 Fig. 4): off-policy guidance learns where on-policy rollouts almost never "
          "succeed; on-policy GRPO's train reward stays near zero",
          (Arm("grpo", "grpo"), Arm("luffy", "luffy", LUFFY_PAPER)), steps=250, eval_every=10, baseline="grpo",
          common=(*BEYOND_LEVEL, *CONSTANT_LR, "loss.entropy_coef=0.001"), threshold=0.05, testbed="steps", seeds=5,
          traces=("accuracy/train", "accuracy/train_groups_solved", "luffy/reward_onpolicy", "entropy"),
          registered="Re-registered 2026-11-29 10:00 UTC before any run (the 6-digit registration of 64faf93 "
                     "failed its pre-check). Both arms from the testbed's warm model, 250 steps × 64 samples, "
                     "constant lr, entropy coefficient 0.001 in both, LUFFY with 1 of 8 rows a teacher row and "
                     "p/(p + 0.1) shaping, seeds 0-4. Amended 2026-11-29 10:01 UTC, before the LUFFY arm's "
                     "first run (only GRPO seed 0 had started; of it, progress lines with training reward and "
                     "held-out accuracy 0.00 had been seen, as the pre-check predicted): the LUFFY arm "
                     "takes the paper's estimator options as the issue asks (LUFFY_PAPER: advantages over all 8 "
                     "rows with the teacher row, no std division, no on-policy clip), not the shipped config's "
                     "grpo_split with std and clip. "
                     "Test: Δ = final held-out greedy accuracy LUFFY − GRPO, paired over the 5 seeds "
                     "(bench.common.stats.paired_accuracy_delta, df = 4), paper's sign +1, matters 0.05 (the "
                     "study's threshold): words by bench.common.stats.verdict. Reported beside it, not tested: "
                     "on-policy train accuracy (accuracy/train: generated rows only) and the share of groups with "
                     "at least one right generated row (accuracy/train_groups_solved), each as the mean of steps "
                     "201-250 per arm, paired over seeds; the held-out pass@8 of each final model (200 held-out "
                     "prompts × 8 samples at temperature 1, bench/evidence/level_precheck.py's sampler). "
                     "Analysis amended 2026-11-29 14:05 UTC, after seeds 0-2 had ended at 0.000 in both arms "
                     "(every pair equal, so the test above has no noise) and before seeds 3-4 finished (GRPO's were "
                     "running, their progress lines at 0.00 seen; LUFFY's had not started): when no "
                     "arm answered any held-out prompt on any seed, the word is not reproduced if 0 of the 200 "
                     "prompts bounds the accuracy below 0.05 (exact binomial, one-sided 95 %: 0.015), "
                     "otherwise inconclusive (bench/evidence/study_tests.py:none_right_word)."),
    Study("steps-pacs5", "PACS against GRPO at lr 2.5e-5, 4 optimiser steps each, 250 steps",
          "PACS (Li et al. 2025, v2 Table 2, Fig. 5): beats GRPO at equal samples, most at large-k pass@k, and "
          "keeps entropy where GRPO's collapses",
          (Arm("grpo", "grpo", ("learner.mini_batches=4",)), Arm("pacs", "pacs")), steps=250, eval_every=10,
          baseline="grpo", testbed="steps", common=(*PACS_LEVEL, "learner.lr=2.5e-5"), seeds=5,
          traces=("accuracy/train", "entropy", "response/length_mean"),
          registered="Re-registered 2026-11-29 10:00 UTC before any run (the 6-digit registration of 64faf93 "
                     "failed its pre-check). Both arms from the testbed's warm model at lr 2.5e-5 and 4 optimiser "
                     "steps per RL step (GRPO: learner.mini_batches=4; PACS: its config's 4), 250 steps × 64 "
                     "samples, seeds 0-4. Test: Δ = final held-out greedy accuracy PACS − GRPO, paired over the "
                     "5 seeds (paired_accuracy_delta, df = 4), paper's sign +1, matters 0.05; words by "
                     "bench.common.stats.verdict, and inconclusive whatever it says if the precondition's "
                     "entropy half fails (PRECONDITION). Reported beside it, not tested: each arm's entropy over "
                     "the run, and the final models' pass@k for k = 1 ... 64 (64 held-out prompts × 64 samples "
                     "at temperature 1), PACS − GRPO per k paired over seeds: the paper's gain is largest at "
                     "large k."),
)
STUDIES.update({s.name: s for s in ISSUE43})
