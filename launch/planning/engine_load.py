"""Before anything starts: will the run keep its GPU engines busy? (`configs.concurrency` says why it matters.)

An engine's KV tokens are known for sure only once it has started (it prints them, and each actor sizes
`rollout.prompts_in_flight: auto` from them). Before that they are estimated per GPU from the model's
config.json, the way `algo-train doctor` does with the memory it measures:

    rollout.kv_cache_gib set:  kv_cache_gib
    else:                      gpu_memory_utilization × GPU memory − weights / tensor_parallel_size − ENGINE_RESERVE_GIB

times tensor_parallel_size GPUs (each holds 1/tp of the KV heads), over the KV bytes per token. The GPU
memory is that of the GPU type Ray reports for the actors' nodes (the `accelerator_type:<X>` resource
`ray start` sets) from `GPU_GIB`, which takes the smallest card of each type (an A100 counts as 40 GB), so
the estimate errs low and a warning is never raised by an optimistic guess. Without a known type, a set
kv_cache_gib or a readable config.json the planner stays silent; the engines' start lines and the
doctor still say it. Qwen2.5-7B on an H100 at 0.85: (0.85 × 79 GiB − 15.23 GB − 4 GiB) × 1 / 57,344 B
≈ 917 k tokens, 223 sequences of 1,024 + 3,072 tokens (tests/launch/test_cluster_plan.py works it out).
"""

from __future__ import annotations

from collections.abc import Sequence

from configs.concurrency import EngineLoad, engine_load
from configs.schema import RunConfig
from configs.shared import GPU_MEMORY_UTILIZATION
from launch.planning.model_shape import DTYPE_BYTES, ModelShape

GIB = 2**30
ENGINE_RESERVE_GIB = 4.0  # a GPU engine's share kept free of KV: CUDA graphs, activations, push transients
VLLM_MAX_NUM_SEQS = 128  # vLLM 0.32 AsyncLLM's max_num_seqs when unset (SchedulerConfig.DEFAULT_MAX_NUM_SEQS)
GPU_GIB = {  # GiB of one GPU of each type Ray names (ray.util.accelerators), its smallest model, rounded down
    "A10G": 22.0, "L4": 22.0, "L40S": 44.0, "A100": 39.0, "H100": 79.0, "H200": 139.0,
}


def gpu_of(custom) -> tuple[float, str] | None:
    """(GiB per GPU, type) of a node with these Ray resources (`accelerator_type:<X>`), None for an unknown type."""
    types = [k.split(":", 1)[1] for k in custom if k.startswith("accelerator_type:")]
    return min(((GPU_GIB[t], t) for t in types if t in GPU_GIB), default=None)


def engine_kv_tokens(cfg: RunConfig, shape: ModelShape, gpu_gib: float | None) -> int | None:
    """The KV tokens one GPU engine of `cfg` gets (module docstring); None without kv_cache_gib or GPU memory."""
    r = cfg.rollout
    tp, d = r.engine.tensor_parallel_size, DTYPE_BYTES[cfg.model.resolved_dtype(gpu=True)]
    if r.kv_cache_gib is not None:
        per_gpu = r.kv_cache_gib * GIB
    elif gpu_gib is not None:
        util = r.engine.gpu_memory_utilization or GPU_MEMORY_UTILIZATION
        per_gpu = util * gpu_gib * GIB - shape.parameters() * d / tp - ENGINE_RESERVE_GIB * GIB
    else:
        return None
    return shape.kv_tokens(max(per_gpu, 0.0) * tp, d)


def gpu_engine_load(cfg: RunConfig, kv_tokens: int | None, actors: int) -> EngineLoad:
    """The concurrency of one GPU engine of `cfg` holding `kv_tokens` KV tokens (estimated or measured), among
    `actors` actors, with vLLM's max_num_seqs where the config leaves it unset."""
    return engine_load(cfg, gpu=True, actors=actors, kv_tokens=kv_tokens,
                       max_num_seqs=cfg.rollout.engine.max_num_seqs or VLLM_MAX_NUM_SEQS)


def idle_warning(cfg: RunConfig, kv_tokens: int | None, actors: int) -> tuple[str, str] | None:
    """(what was found, the fix) when the credit or the actor count leaves a GPU engine of `cfg` holding
    `kv_tokens` KV tokens mostly idle (`configs.concurrency.EngineLoad.warning`), else None: the planner's
    note, and `algo-train doctor`'s WARN row with the KV tokens it estimates per node."""
    return gpu_engine_load(cfg, kv_tokens, actors).warning()


def idle_note(cfg: RunConfig, actor_nodes: Sequence, actors: int) -> str | None:
    """The start line of a resolved run whose GPU engines its credit or actor count leaves mostly idle, with
    the fix; `actor_nodes`: the nodes the plan puts actors on. None when they are busy or nothing is known."""
    if not actors or not cfg.rollout.gpus_per_actor or cfg.model.path is None:
        return None
    try:
        shape = ModelShape.read(cfg.model.path)
    except (OSError, KeyError, TypeError, ValueError):
        return None
    gpu = min((g for node in actor_nodes if (g := gpu_of(node.custom)) is not None), default=None)
    kv = engine_kv_tokens(cfg, shape, gpu[0] if gpu else None)
    said = idle_warning(cfg, kv, actors)
    if said is None:
        return None
    r = cfg.rollout
    how = (f"rollout.kv_cache_gib={r.kv_cache_gib:g} per GPU" if r.kv_cache_gib is not None else
           f"{r.engine.gpu_memory_utilization or GPU_MEMORY_UTILIZATION:g} of a {gpu[0]:g} GiB {gpu[1]} − weights − "
           f"{ENGINE_RESERVE_GIB:g} GiB")
    return (f"[plan] engines mostly idle: {said[0]} — {said[1]}; estimated {kv:,} KV tokens per engine ({how}; each "
            "engine prints its own at start)")
