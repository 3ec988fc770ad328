"""The keys veRL (Hydra paths) and TRL (GRPOConfig / TrainingArguments fields) use, mapped to ours.

A user porting a run brings these names. Each entry says which key of ours holds the same or the closest
setting, and whether the meaning is the same:

- same meaning and unit (`same=True`): the key is accepted under that name and read as ours, with a
  one-line notice (`configs.loading` moves it wherever keys enter: `--config` YAML and `--set`);
- only related (`same=False`): the key stays unknown, and the error suggests ours with what differs —
  a unit (TRL counts optimiser steps, a learner step here is `learner.mini_batches × learner.epochs` of
  them; per-device samples vs prompts over all ranks), an extra switch, or a different quantity under a
  shared name (TRL's `beta` is a KL coefficient, not `pacs.beta`).

Each mapping was read against the description of our key (its unit) in `configs/`; the table in
docs/running.md ("Coming from veRL or TRL") is written from this one. Nothing here imports pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass

VERL, TRL = "veRL", "TRL"


@dataclass(frozen=True)
class Alias:
    name: str  # the key as veRL (a dotted Hydra path) or TRL (a flat field name) spells it
    origin: str  # VERL or TRL
    ours: str | None  # our dotted key of the same or closest meaning; None = nothing to set here
    same: bool  # True = same meaning and unit: accepted under `name`
    note: str = ""  # same: what to know when it is read as ours; related: how it differs (a clause after the name)


def _table(origin: str, rows: list[tuple]) -> list[Alias]:
    return [Alias(name, origin, ours, same, *note) for name, ours, same, *note in rows]


_A, _R = True, False  # accepted, related (suggestion only)
_OPT_STEPS = ("counts optimiser steps; {ours} counts learner steps, each learner.mini_batches × learner.epochs "
              "optimiser steps (the same only when both are 1): divide by their product")
_AR, _ACT, _ROLL = "actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.rollout"

ALIASES: dict[str, Alias] = {a.name: a for a in _table(VERL, [
    ("data.train_batch_size", "learner.batch_prompts", _A),
    ("data.max_prompt_length", "data.max_prompt_tokens", _A,
     "a longer prompt is skipped, as with veRL's data.filter_overlong_prompts=true"),
    ("data.max_response_length", "rollout.max_response_tokens", _A),
    ("data.train_files", "data.path", _R, "lists files; here one file or hf://NAME: pass --data FILE, which also "
                                          "sets data.task=file"),
    ("data.val_files", "data.eval_path", _A, "one file or hf://NAME"),
    ("data.prompt_key", "data.fields.prompt", _A),
    ("data.trust_remote_code", "model.trust_remote_code", _A),
    (f"{_AR}.model.path", "model.path", _A),
    (f"{_AR}.model.trust_remote_code", "model.trust_remote_code", _A),
    (f"{_AR}.model.enable_gradient_checkpointing", "learner.activation_checkpointing", _A),
    (f"{_ACT}.optim.lr", "learner.lr", _A),
    (f"{_ACT}.optim.weight_decay", "learner.weight_decay", _A),
    (f"{_ACT}.optim.betas", "learner.betas", _A),
    (f"{_ACT}.optim.warmup_style", "learner.lr_schedule", _A),
    (f"{_ACT}.optim.lr_scheduler_type", "learner.lr_schedule", _A),
    (f"{_ACT}.optim.lr_warmup_steps", "learner.warmup_steps", _R,
     "counts training steps (veRL steps its scheduler once per batch); learner.warmup_steps counts optimiser "
     "steps: multiply by learner.mini_batches × learner.epochs"),
    (f"{_ACT}.optim.lr_warmup_steps_ratio", "learner.warmup_steps", _R,
     "is a share of the run; learner.warmup_steps is a count of optimiser steps (ratio × learner.steps × "
     "learner.mini_batches × learner.epochs)"),
    (f"{_ACT}.grad_clip", "learner.grad_clip", _A),
    (f"{_ACT}.ppo_epochs", "learner.epochs", _A),
    (f"{_ACT}.ppo_mini_batch_size", "learner.mini_batches", _R,
     "counts prompts per optimiser step; learner.mini_batches counts optimiser steps per batch: "
     "learner.batch_prompts / ppo_mini_batch_size"),
    (f"{_ACT}.ppo_micro_batch_size_per_gpu", "learner.micro_batch_samples", _A),
    (f"{_ACT}.ppo_max_token_len_per_gpu", "learner.micro_batch_tokens", _R,
     "applies only with use_dynamic_bsz=true, instead of the sample count; learner.micro_batch_tokens (model-"
     "input tokens per micro-batch, per rank) always applies, on top of learner.micro_batch_samples"),
    (f"{_ACT}.use_dynamic_bsz", "learner.micro_batch_tokens", _R,
     "has no switch here: micro-batches are always cut by learner.micro_batch_tokens too (auto = 16384 on GPUs)"),
    (f"{_ACT}.clip_ratio", "loss.clip_low", _R, "sets both bounds: set loss.clip_low and loss.clip_high"),
    (f"{_ACT}.clip_ratio_low", "loss.clip_low", _A),
    (f"{_ACT}.clip_ratio_high", "loss.clip_high", _A),
    (f"{_ACT}.clip_ratio_c", "loss.dual_clip", _A, "null = off here, where veRL's default 3.0 is on"),
    (f"{_ACT}.entropy_coeff", "loss.entropy_coef", _A),
    (f"{_ACT}.loss_agg_mode", "loss.agg", _A),
    (f"{_ACT}.use_kl_loss", "loss.kl_coef", _R, "has no switch here: the KL loss is on when loss.kl_coef > 0"),
    (f"{_ACT}.kl_loss_coef", "loss.kl_coef", _A,
     "veRL's kl_loss_type defaults to low_var_kl, loss.kl_estimator here to k1"),
    (f"{_ACT}.kl_loss_type", "loss.kl_estimator", _A),
    (f"{_ACT}.policy_loss.loss_mode", "loss.ratio_level", _R,
     "gspo is loss.ratio_level=sequence here; vanilla is the default"),
    (f"{_ROLL}.n", "rollout.n", _A),
    (f"{_ROLL}.temperature", "rollout.temperature", _A),
    (f"{_ROLL}.top_p", "rollout.top_p", _A),
    (f"{_ROLL}.top_k", "rollout.top_k", _A),
    (f"{_ROLL}.tensor_model_parallel_size", "rollout.engine.tensor_parallel_size", _A),
    (f"{_ROLL}.gpu_memory_utilization", "rollout.engine.gpu_memory_utilization", _A),
    (f"{_ROLL}.max_num_seqs", "rollout.engine.max_num_seqs", _A),
    (f"{_ROLL}.enforce_eager", "rollout.engine.enforce_eager", _A),
    (f"{_ROLL}.enable_prefix_caching", "rollout.engine.enable_prefix_caching", _A),
    (f"{_ROLL}.val_kwargs.temperature", "rollout.eval_temperature", _A),
    (f"{_ROLL}.name", None, _R, "picks the engine: generation always runs on vLLM actors here — drop it"),
    ("algorithm.adv_estimator", None, _R, "picks the algorithm: choose it with --algo (grpo, rloo, ...; "
                                          "algo-train --help lists them)"),
    ("algorithm.norm_adv_by_std_in_grpo", "grpo.use_std", _A),
    ("algorithm.use_kl_in_reward", "loss.kl_coef", _R,
     "puts a KL penalty in the reward, which here only PURE has (pure.kl_coef); every algorithm's KL loss term "
     "is loss.kl_coef (veRL's actor.kl_loss_coef)"),
    ("algorithm.kl_ctrl.kl_coef", "loss.kl_coef", _R,
     "weighs a KL penalty in the reward (use_kl_in_reward), which here only PURE has (pure.kl_coef); every "
     "algorithm's KL loss term is loss.kl_coef (veRL's actor.kl_loss_coef)"),
    ("algorithm.kl_penalty", "loss.kl_estimator", _R,
     "is the estimator of the KL in the reward (pure.kl_estimator here, PURE only); the KL loss's is "
     "loss.kl_estimator"),
    ("trainer.total_training_steps", "learner.steps", _A),
    ("trainer.total_epochs", "learner.steps", _R,
     "counts passes over the data; runs are counted in steps here: epochs × training prompts / "
     "learner.batch_prompts"),
    ("trainer.save_freq", "learner.save_every", _A, "0 = only at the end (there is no never)"),
    ("trainer.test_freq", "learner.eval_every", _A, "0 = never, veRL's -1"),
    ("trainer.default_local_dir", "logging.output_dir", _A, "the run folder: checkpoints go to its checkpoints/"),
    ("trainer.project_name", "logging.wandb_project", _A),
    ("trainer.experiment_name", "logging.output_dir", _R, "names the run; here its folder does: --output DIR"),
    ("trainer.logger", "logging.wandb", _R, "is a list; here the console is always on, TensorBoard is "
                                            "logging.tensorboard (on) and W&B logging.wandb=true"),
    ("trainer.n_gpus_per_node", "learner.world_size", _R,
     "shares its GPUs between training and generation; here the learner has learner.world_size GPUs and the "
     "actors others (rollout.num_actors × rollout.engine.tensor_parallel_size)"),
    ("trainer.nnodes", None, _R, "is not needed: Ray places learner.world_size ranks and rollout.num_actors "
                                 "actors on the cluster's nodes"),
    ("custom_reward_function.path", "reward.fn", _R,
     "and custom_reward_function.name are one key here: reward.fn=path/to/file.py:function"),
    ("custom_reward_function.name", "reward.fn", _R,
     "and custom_reward_function.path are one key here: reward.fn=path/to/file.py:function"),
    ("reward_model.overlong_buffer.enable", "loss.overlong_cache_tokens", _R,
     "has no switch here: the soft overlong punishment is on when loss.overlong_cache_tokens > 0"),
    ("reward_model.overlong_buffer.len", "loss.overlong_cache_tokens", _A,
     "on when > 0: there is no enable switch"),
    ("reward_model.overlong_buffer.penalty_factor", "loss.overlong_penalty_factor", _A),
]) + _table(TRL, [
    ("learning_rate", "learner.lr", _A),
    ("num_generations", "rollout.n", _A),
    ("max_completion_length", "rollout.max_response_tokens", _A),
    ("max_prompt_length", "data.max_prompt_tokens", _R,
     "cuts a longer prompt from the left; here a longer prompt is skipped, never cut"),
    ("temperature", "rollout.temperature", _A),
    ("top_p", "rollout.top_p", _A),
    ("top_k", "rollout.top_k", _A),
    ("beta", "loss.kl_coef", _R,
     "is the KL coefficient, with the k3 estimator (loss.kl_estimator=low_var_kl here, clamped); pacs.beta and "
     "prime.beta are other quantities"),
    ("epsilon", "loss.clip_low", _R,
     "is the lower clip bound, and the upper one too unless epsilon_high is set: set loss.clip_low and "
     "loss.clip_high"),
    ("epsilon_high", "loss.clip_high", _A),
    ("num_iterations", "learner.epochs", _A),
    ("steps_per_generation", "learner.mini_batches", _R,
     "counts optimiser steps per generation batch of per-device samples; learner.mini_batches cuts "
     "learner.batch_prompts prompts into that many optimiser steps"),
    ("importance_sampling_level", "loss.ratio_level", _A),
    ("mask_truncated_completions", "loss.overlong_filter", _A),
    ("loss_type", "loss.agg", _R,
     "names losses, loss.agg aggregations: dapo and bnpo = token-mean, grpo = seq-mean-token-mean, dr_grpo = "
     "seq-mean-token-sum-norm (veRL's scale: summed over rows) with grpo.use_std=false"),
    ("scale_rewards", "grpo.use_std", _R,
     "true or group = grpo.use_std=true, false or none = grpo.use_std=false; batch has no equivalent"),
    ("per_device_train_batch_size", "learner.batch_prompts", _R,
     "counts samples per device; learner.batch_prompts counts prompts per step over all ranks (per_device_"
     "train_batch_size × devices × gradient_accumulation_steps / num_generations), learner.micro_batch_samples "
     "samples per forward/backward on one rank"),
    ("gradient_accumulation_steps", "learner.micro_batch_samples", _R,
     "follows from the batch here: learner.batch_prompts × rollout.n samples are split into micro-batches of "
     "learner.micro_batch_samples per rank"),
    ("max_steps", "learner.steps", _R, _OPT_STEPS.format(ours="learner.steps")),
    ("save_steps", "learner.save_every", _R, _OPT_STEPS.format(ours="learner.save_every")),
    ("eval_steps", "learner.eval_every", _R, _OPT_STEPS.format(ours="learner.eval_every")),
    ("logging_steps", "logging.log_every", _R, _OPT_STEPS.format(ours="logging.log_every")),
    ("num_train_epochs", "learner.steps", _R,
     "counts passes over the data; runs are counted in steps here: epochs × training prompts / "
     "learner.batch_prompts"),
    ("warmup_steps", "learner.warmup_steps", _A),
    ("warmup_ratio", "learner.warmup_steps", _R,
     "is a share of the run; learner.warmup_steps is a count of optimiser steps"),
    ("lr_scheduler_type", "learner.lr_schedule", _A),
    ("weight_decay", "learner.weight_decay", _A),
    ("adam_beta1", "learner.betas", _R, "and adam_beta2 are one key here: learner.betas=[beta1, beta2]"),
    ("adam_beta2", "learner.betas", _R, "and adam_beta1 are one key here: learner.betas=[beta1, beta2]"),
    ("max_grad_norm", "learner.grad_clip", _A),
    ("gradient_checkpointing", "learner.activation_checkpointing", _A),
    ("bf16", "model.dtype", _R, "is a switch; model.dtype=bfloat16 here (auto = bfloat16 on GPUs)"),
    ("output_dir", "logging.output_dir", _A),
    ("model_name_or_path", "model.path", _A),
    ("trust_remote_code", "model.trust_remote_code", _A),
    ("dataset_name", "data.path", _R, "is a Hub name; here pass --data hf://NAME (it also sets data.task=file)"),
    ("report_to", "logging.wandb", _R, "is a list; here TensorBoard is logging.tensorboard (on) and W&B "
                                       "logging.wandb=true"),
    ("log_completions", "logging.samples_every", _R,
     "prints samples; here they go to samples.jsonl every logging.samples_every steps"),
    ("use_vllm", None, _R, "is always on here: generation runs on vLLM actors — drop it"),
    ("vllm_gpu_memory_utilization", "rollout.engine.gpu_memory_utilization", _A),
    ("vllm_tensor_parallel_size", "rollout.engine.tensor_parallel_size", _A),
])}


def accepted(key: str) -> Alias | None:
    """The entry of a veRL/TRL key that is read as ours (same meaning), else None."""
    alias = ALIASES.get(key)
    return alias if alias is not None and alias.same else None


def leads_to_alias(prefix: str) -> bool:
    """True when some accepted alias lies under the dotted `prefix` (a YAML section worth walking)."""
    return any(a.same and a.name.startswith(prefix + ".") for a in ALIASES.values())


def notice(alias: Alias) -> str:
    """The line said when `alias` is read as ours."""
    note = f" ({alias.note})" if alias.note else ""
    return f"[config] {alias.name} is {alias.origin}'s name: read as {alias.ours}{note}"


def _matches(key: str) -> list[Alias]:
    """Entries for an unknown key: its exact name; else those it is a dotted tail of (`optim.lr`), or whose
    last part it ends with (`learner.learning_rate`), when they all lead to one key of ours."""
    if key in ALIASES:
        return [ALIASES[key]]
    last = key.rsplit(".", 1)[-1]
    hits = [a for a in ALIASES.values()
            if a.name.endswith("." + key) or a.name.rsplit(".", 1)[-1] == last]
    return hits if hits and len({a.ours for a in hits}) == 1 else []


def hint(key: str) -> str | None:
    """' — did you mean ...' for an unknown key that veRL or TRL use, with what differs; None if none do."""
    found = _matches(key)
    if not found:
        return None
    a = found[0]
    if a.same:  # a near miss of a name that is accepted: point at ours
        return f" — did you mean {a.ours!r}? ({a.origin}'s {a.name})"
    ours = f" did you mean {a.ours!r}?" if a.ours else ""
    return f" —{ours} {a.origin}'s {a.name} {a.note}"
