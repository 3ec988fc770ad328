"""The typed schema of a whole run. Every field states its unit.

Units used in descriptions: *prompts* (groups), *samples* (responses; a group of one prompt holds
`rollout.n` samples), *tokens*, *steps* (learner steps: one pulled batch, one weight push, made of
`learner.mini_batches × learner.epochs` *optimiser steps*), *versions* (= learner steps: a version is a push).
"Global" means summed over all learner ranks; "per rank" means one data-parallel rank.

Unknown keys are rejected (`extra="forbid"`), and cross-field rules are checked by `RunConfig.problems`
with the dotted key name and a one-line fix in the message: the rules every algorithm shares here
(written against what its spec declares: demonstrations, whole-group micro-batches), each algorithm's
own in its module (`AlgoSpec.validate`). `algo` is any name in the registry.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, create_model, field_validator, model_validator

import algos
from algos.spec import TEACHER
from configs.algo_sections import SECTIONS
from configs.base import Section
from configs.buffer_section import BufferConfig, auto_capacity_groups
from configs.data_section import DataConfig
from configs.env_section import EnvConfig, env_problems
from configs.shared import (
    LearnerConfig,
    LoggingConfig,
    LossConfig,
    ModelConfig,
    ResumeRecord,
    RewardConfig,
    RolloutConfig,
    WeightSyncConfig,
)
from configs.teacher_section import TeacherConfig


class _SharedConfig(Section):
    """Every section but the algorithms' own (`RunConfig` adds those from the registry)."""

    algo: str = Field("grpo", description="algorithm: a name registered in algos/ (the --algo choices)")
    seed: int = Field(0, description="seed of prompt order, sampling and the tiny model (learner.seed: the learner's torch seed)")
    serial: bool = Field(False, description="no Ray: learner and actors as objects in the driver process (debugging)")
    ray_address: str | None = Field(
        None, description="Ray cluster to join (host:port, or auto = the one RAY_ADDRESS or a local `ray start` "
                          "names); null = that one when it exists, else start a local Ray (a single machine). "
                          "config.yaml records the cluster joined")
    placement_timeout_s: float = Field(
        60.0, gt=0, description="seconds Ray may take to place the learner ranks and the actors (placement "
                                "groups); past it the run stops with what was asked and what each node has")
    resume: str | None = Field(None, description="run folder to resume from")
    max_restarts: int = Field(
        0, ge=0, description="times a run whose learner rank died resumes itself from its last checkpoint "
                             "(0 = it stops and prints the --resume command)")
    resumed: list[ResumeRecord] = Field(
        [], description="each resume of this run: the step it resumed at and the keys it changed (written by "
                        "--resume; see launch.state.rundir.RESUME_SAFE for the keys a resume may change)")
    model: ModelConfig = Field(ModelConfig(), description="the policy model")
    data: DataConfig = Field(DataConfig(), description="prompts, held-out split and demonstrations")
    reward: RewardConfig = Field(RewardConfig(), description="the outcome reward and its time limit")
    rollout: RolloutConfig = Field(RolloutConfig(), description="vLLM actors: sampling, group size, resources")
    buffer: BufferConfig = Field(BufferConfig(), description="the replay buffer: staleness bound, filters, service")
    learner: LearnerConfig = Field(LearnerConfig(), description="the FSDP learner: batch geometry, optimiser, schedule, steps")
    weight_sync: WeightSyncConfig = Field(WeightSyncConfig(), description="learner → vLLM weight pushes")
    loss: LossConfig = Field(LossConfig(), description="policy-loss options shared by the algorithms")
    env: EnvConfig = Field(EnvConfig(), description="multi-turn, tool-using rollouts (off by default: single-turn)")
    teacher: TeacherConfig = Field(TeacherConfig(), description="the frozen teacher model of distillation (--algo opd)")

    @field_validator("algo")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in algos.names():
            raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(algos.names())}")
        return name

    @model_validator(mode="after")
    def _cross_field_rules(self) -> _SharedConfig:
        if self.buffer.capacity_groups == "auto":  # the buffer's room grows with the actors (configs.buffer_section)
            self.buffer.capacity_groups = auto_capacity_groups(self.rollout.num_actors)
        problems = list(self.problems())
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def problems(self):
        """Yield 'dotted.key: what is wrong — how to fix' for impossible combinations: the rules that hold
        for every algorithm (written against the spec's declared needs), then the algorithm's own
        (`AlgoSpec.validate`, in its options module)."""
        spec = algos.get(self.algo)
        n = self.rollout.n
        if (spec.needs_demonstrations and self.data.demos is None and self.data.task == "file"
                and self.teacher.live_traces == "off"):
            yield (f"data.demos: {self.algo} needs demonstrations but none were given — "
                   "pass --demos FILE (parquet/JSONL with a `target` column), or have a teacher write them "
                   "(teacher.path and teacher.live_traces=missing)")
        if spec.whole_groups_per_microbatch and self.learner.micro_batch_samples % n:
            yield (f"learner.micro_batch_samples: {self.algo} needs whole groups per micro-batch but "
                   f"{self.learner.micro_batch_samples} is not a multiple of rollout.n={n} — use "
                   f"{max(n, self.learner.micro_batch_samples // n * n)}")
        if self.buffer.acc_lo > self.buffer.acc_hi:
            yield "buffer.acc_lo: greater than buffer.acc_hi — swap them"
        if self.model.path is None:
            t = self.model.tiny
            if t.hidden_size % t.num_heads or t.hidden_size // t.num_heads != 64:
                yield (f"model.tiny.hidden_size: head_dim = {t.hidden_size}/{t.num_heads} must be 64 for vLLM's "
                       f"CPU attention — use hidden_size = 64 × num_heads = {64 * t.num_heads}")
        if self.data.task == "file" and self.data.path is None and not spec.trains_on_demonstrations_only:
            yield "data.path: data.task=file needs a dataset — pass --data FILE or set data.task=arithmetic"
        if self.learner.batch_prompts * n < self.learner.world_size:
            yield (f"learner.batch_prompts: {self.learner.batch_prompts} prompts × {n} samples cannot feed "
                   f"{self.learner.world_size} ranks — raise learner.batch_prompts")
        if self.loss.overlong_cache_tokens > self.rollout.max_response_tokens:
            yield (f"loss.overlong_cache_tokens: {self.loss.overlong_cache_tokens} exceeds the generation limit "
                   f"rollout.max_response_tokens={self.rollout.max_response_tokens} — lower it")
        tp, g = self.rollout.engine.tensor_parallel_size, self.rollout.gpus_per_actor
        if g != "auto" and (g == 0 < tp - 1 or g > 0 and g != tp and (tp > 1 or g > 1)):
            yield (f"rollout.gpus_per_actor: {g:g} GPU(s) per actor but rollout.engine.tensor_parallel_size={tp} "
                   f"shards each engine over {tp} GPU(s) — use rollout.gpus_per_actor=auto (= {tp})"
                   + (f", a fraction ≤ 1 to share GPUs, or rollout.engine.tensor_parallel_size={g:g}"
                      if tp == 1 and g == int(g) else ""))
        util = self.rollout.engine.gpu_memory_utilization
        if g != "auto" and 0 < g < 1 and (util is None or util > g):
            yield (f"rollout.engine.gpu_memory_utilization: engines share GPUs (rollout.gpus_per_actor={g:g}) and "
                   f"vLLM's start-up check asks each for {'its default 0.92' if util is None else f'{util:g}'} of "
                   f"a GPU — use at most {g:g}")
        if self.learner.mini_batches > self.learner.batch_prompts:
            yield (f"learner.mini_batches: {self.learner.mini_batches} mini-batches of whole groups need at least "
                   f"as many prompts per step, learner.batch_prompts={self.learner.batch_prompts} — lower "
                   "learner.mini_batches or raise learner.batch_prompts")
        yield from self._teacher_problems(spec)
        yield from self._credit_problems(spec)
        yield from self._count_problems(spec)
        yield from env_problems(self)
        if self.model.lora.enabled and self.model.lora.dropout > 0:
            yield (f"model.lora.dropout: {self.model.lora.dropout:g} is not supported — set it to 0: the learner keeps "
                   "every dropout off so that π_prox, recomputed at a step's start, equals the policy that trains "
                   "(docs/algorithms.md \"LoRA\")")
        yield from spec.validate(self)

    def _teacher_problems(self, spec):
        """teacher.live_traces: the teacher writes LUFFY's traces, so it needs LUFFY and a teacher;
        teacher.scoring=engine scores for an algorithm that reads the teacher's log-probs, with a teacher."""
        if self.teacher.scoring == "engine":
            if TEACHER not in spec.requires(self):
                yield (f"teacher.scoring: engine scores the teacher's log-probs but --algo {self.algo} reads none — "
                       "set teacher.scoring=learner, or use --algo opd")
            if self.teacher.path is None:
                yield ("teacher.scoring: engine needs a teacher to score with and teacher.path is unset — set "
                       "teacher.path to a local HF model directory or a Hub id in the local HF cache "
                       "(--set teacher.path=DIR)")
        live = self.teacher.live_traces
        if live == "off":
            return
        if self.algo != "luffy":
            yield (f"teacher.live_traces: {live} asks the teacher for LUFFY's traces but --algo {self.algo} reads "
                   "none — set teacher.live_traces=off, or use --algo luffy")
        if self.teacher.path is None:
            yield (f"teacher.live_traces: {live} needs a teacher to write the traces and teacher.path is unset — "
                   "set teacher.path to a local HF model directory or a Hub id in the local HF cache "
                   "(--set teacher.path=DIR), or teacher.live_traces=off")

    def _credit_problems(self, spec):
        """The batch against the buffer's credit (`buffer.admission`). The buffer grants credit for at most
        W = min((max_staleness + 1) × batch_prompts, capacity_groups) groups stored or in flight at once,
        shared fairly among the actors waiting for it: about W / num_actors each, at most prompts_in_flight.
        The learner pulls batch_prompts stored groups at once, so it needs W ≥ batch_prompts; as
        (K + 1) × B ≥ B, that is capacity_groups ≥ batch_prompts. Fewer units than actors (W < num_actors)
        or than they could run (W < num_actors × prompts_in_flight) works: actors take turns."""
        if self.buffer.max_staleness_auto and self.buffer.max_staleness_cap < self.buffer.max_staleness:
            yield (f"buffer.max_staleness_cap: {self.buffer.max_staleness_cap} is below buffer.max_staleness="
                   f"{self.buffer.max_staleness}, where max_staleness_auto starts (it only raises K) — raise the cap")
        if spec.trains_on_demonstrations_only:  # the driver makes its batches itself
            return
        b, cap, k = self.learner.batch_prompts, self.buffer.capacity_groups, self.buffer.max_staleness
        if b > cap:
            yield (f"learner.batch_prompts: a batch of {b} groups cannot be pulled from a buffer that holds at most "
                   f"buffer.capacity_groups={cap} (stored + in flight) — raise buffer.capacity_groups to at least "
                   f"{b} ({(k + 1) * b} = (max_staleness + 1) × batch_prompts lets the actors use the whole "
                   "staleness window) or lower learner.batch_prompts")

    def _count_problems(self, spec):
        """Rules on counts that contradict each other (group size, digits, LR warm-up and horizon, context)."""
        n, lc, a = self.rollout.n, self.learner, self.data.arithmetic
        if n < spec.min_group_size and not spec.trains_on_demonstrations_only:
            yield (f"rollout.n: {self.algo} compares each sample with the other samples of its prompt's group, "
                   f"which a group of {n} does not have — set rollout.n to at least {spec.min_group_size} (e.g. 8)")
        if a.min_digits > a.max_digits:
            yield (f"data.arithmetic.min_digits: {a.min_digits} is more than data.arithmetic.max_digits="
                   f"{a.max_digits} — swap them")
        updates = lc.mini_batches * lc.epochs
        if lc.warmup_steps > lc.steps * updates:
            yield (f"learner.warmup_steps: {lc.warmup_steps} optimiser steps of LR warm-up exceed the whole run, "
                   f"learner.steps={lc.steps} × mini_batches {lc.mini_batches} × epochs {lc.epochs} = "
                   f"{lc.steps * updates}, so the peak lr is never reached — use at most {lc.steps * updates} "
                   "(e.g. --set learner.warmup_steps=0)")
        h = lc.lr_horizon_steps
        if lc.lr_schedule != "constant" and h is not None and h < lc.steps:
            yield (f"learner.lr_horizon_steps: the {lc.lr_schedule} LR schedule reaches lr 0 at step {h}, so "
                   f"steps {h + 1}–{lc.steps} of learner.steps={lc.steps} would train at lr 0 — set "
                   f"learner.lr_horizon_steps={lc.steps} to decay over the whole run (on a resume the lr then "
                   "moves to the stretched curve at once: it is a function of step / horizon)")
        if self.max_restarts and not lc.save_every and not lc.hf_every:
            yield (f"max_restarts: a restart resumes from the last checkpoint, and with learner.save_every=0 (and "
                   f"learner.hf_every=0) the first is written at the end, so --max-restarts {self.max_restarts} could "
                   f"never restart anything — checkpoint as you go: --set learner.save_every=K (e.g. "
                   f"{max(1, lc.steps // 10)})")
        context = self.data.max_prompt_tokens + self.rollout.max_response_tokens
        if self.model.path is None and context > self.model.tiny.max_position_embeddings:
            yield (f"rollout.max_response_tokens: data.max_prompt_tokens + rollout.max_response_tokens = {context} "
                   f"tokens exceed the built-in model's context, model.tiny.max_position_embeddings="
                   f"{self.model.tiny.max_position_embeddings} — lower them or raise that key")


def _algorithm_sections() -> dict[str, Any]:
    """{name: (section, default)} for every registered algorithm with options of its own."""
    return {name: (section, Field(section(), description=f"--algo {name} options")) for name, section in SECTIONS.items()}


RunConfig = create_model(
    "RunConfig", __base__=_SharedConfig, __module__=__name__, **_algorithm_sections(),
    logging=(LoggingConfig, Field(LoggingConfig(), description="run folder, console, TensorBoard, samples")),
    __doc__="A whole run: the shared sections, then each registered algorithm's options section (`<name>:`).",
)
