"""What a GPU run's learner ranks will need, estimated from the model's config.json before anything starts.

The budget of the GPU-path review (shared/reviews/gpu_path.md, appendix), per rank, bytes:

    sharded state      16 × P / world        fp32 parameters, fp32 gradients, AdamW m and v
    root unit          R × d                 embedding + lm_head unsharded in the compute dtype (R: their
                                             parameters, once when tied), held through forward and backward
    root gradients     R × (d + 4)           their gradients in d plus the fp32 reduce-scatter copy
    prefetched layers  2 × L × d             two decoder layers unsharded (L: one layer's parameters)
    layer inputs       T × layers × h × d    what activation checkpointing keeps (T: micro-batch tokens);
                                             without it T × layers × A
    one layer          T × A                 A = (4h + 2 × MLP width) × d: one layer's activations while it
                                             runs (recompute); ~0.1 MB per token for Qwen2.5-7B
    log-prob head      4 × C × V × 4         fp32 logits of one chunk (C tokens × vocabulary), 4 buffers live
    reference model    P × d / world + R × d with loss.kl_coef > 0
    PURE's HF PRM      P_prm × d             a whole copy per rank (pure.prm=hf; any HF directory an
                                             algorithm names in `AlgoSpec.files` counts so)
  rank 0 only, on the GPU:
    send buffers       2 × max(bucket, largest tensor)   vLLM's packed producer buffers
  rank 0 only, in pinned host memory (`weightsync.staging`: nothing of a push stays on the GPU):
    push payload       P × d                 the serving-dtype weights of the version in flight
    delta baseline     P × d                 weight_sync.mode=delta

d = bytes of model.dtype, h = hidden size, V = vocabulary. Not counted: PRIME's trainable PRM, CUDA and
NCCL workspaces, allocator fragmentation. Qwen2.5-7B on 8 ranks, 16 k-token micro-batches, chunk 4096,
full pushes: rank 0 ≈ 42 GB on its GPU (the appendix's 57 GB less the 15.2 GB payload, which now waits in
host memory) plus 15.2 GB of pinned host memory (tests/launch/test_memory_estimate.py works it out).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from configs.schema import RunConfig
from launch.planning.model_shape import DTYPE_BYTES, ModelShape

GB = 1e9


@dataclass(frozen=True)
class LearnerMemory:
    """(what, bytes) on every rank's GPU, on rank 0's only, and in rank 0's pinned host memory."""

    every_rank: tuple[tuple[str, float], ...]
    rank0_only: tuple[tuple[str, float], ...]
    rank0_host: tuple[tuple[str, float], ...]

    def total(self, rank0: bool) -> float:
        return sum(b for _, b in self.every_rank) + (sum(b for _, b in self.rank0_only) if rank0 else 0.0)


def learner_memory(shape: ModelShape, *, world: int, tokens: int, chunk_tokens: int, checkpointing: bool,
                   dtype_bytes: int = 2, delta: bool = False, reference: bool = False, prm_parameters: int = 0,
                   bucket_bytes: float = 256 * 2**20) -> LearnerMemory:
    """The module docstring's budget for one rank (pure arithmetic)."""
    p, d, h = shape.parameters(), dtype_bytes, shape.hidden
    root = shape.vocab * h * (1 if shape.tied else 2)
    layer = (p - root - h) / shape.layers
    one_layer = (4 * h + 2 * shape.intermediate) * d
    kept = shape.layers * h * d if checkpointing else shape.layers * one_layer
    every = [("fp32 state", 16 * p / world), ("embedding/head", root * d), ("their grads", root * (d + 4)),
             ("2 layers", 2 * layer * d), ("activations", tokens * (kept + one_layer)),
             ("log-prob head", 4 * chunk_tokens * shape.vocab * 4)]
    if reference:
        every.append(("reference", p * d / world + root * d))
    if prm_parameters:
        every.append(("HF PRM", prm_parameters * d))
    rank0 = [("send buffers", 2 * max(bucket_bytes, shape.vocab * h * d))]
    host = [("push payload", p * d)] + ([("delta baseline", p * d)] if delta else [])
    return LearnerMemory(tuple(every), tuple(rank0), tuple(host))


def micro_batch_tokens(cfg: RunConfig, gpu: bool) -> int:
    """Tokens of one micro-batch at most on this device: the token cap, or the row cap × the longest row."""
    lc = cfg.learner
    rows = lc.micro_batch_samples * (cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens)
    cap = lc.resolved_micro_batch_tokens(gpu)
    return min(rows, cap) if cap else rows


def estimate_line(cfg: RunConfig, shape: ModelShape, prm_parameters: int = 0) -> str:
    """The start line of a resolved GPU run: rank 0 and the other ranks, then the items (GB)."""
    lc = cfg.learner
    ac = lc.activation_checkpointing
    tokens, chunk = micro_batch_tokens(cfg, gpu=True), lc.resolved_logprob_chunk_tokens(gpu=True)
    m = learner_memory(shape, world=lc.world_size, tokens=tokens, chunk_tokens=chunk,
                       checkpointing=True if ac == "auto" else bool(ac),
                       dtype_bytes=DTYPE_BYTES[cfg.model.resolved_dtype(gpu=True)],
                       delta=cfg.weight_sync.mode == "delta", reference=cfg.loss.kl_coef > 0,
                       prm_parameters=prm_parameters, bucket_bytes=cfg.weight_sync.bucket_mb * 2**20)
    items = ", ".join(f"{k} {b / GB:.1f}" for k, b in m.every_rank + m.rank0_only)
    others = f", other ranks ≈ {m.total(False) / GB:.1f} GB" if lc.world_size > 1 else ""
    host = sum(b for _, b in m.rank0_host)
    return (f"[run] learner memory per rank (estimate): rank 0 ≈ {m.total(True) / GB:.1f} GB{others} — {items} GB "
            f"({tokens:,}-token micro-batches, log-prob chunk {chunk:,}; lower learner.micro_batch_tokens or "
            f"learner.logprob_chunk_tokens if that is near your GPU's memory); rank 0 stages each push in "
            f"{host / GB:.1f} GB of pinned host memory")


def start_lines(cfg: RunConfig) -> list[str]:
    """What a resolved run prints before it starts about its GPUs: the weight-sync choice when engines share
    GPUs (`launch.planning.resources.sharing_note`) and, for a GPU learner on a model with a readable config.json,
    the memory estimate. Nothing for CPU runs or the built-in model."""
    from launch.planning.resources import sharing_note

    lines = [line for line in [sharing_note(cfg)] if line]
    if not cfg.learner.gpus_per_rank or cfg.model.path is None:
        return lines
    try:
        shape = ModelShape.read(cfg.model.path)
    except (OSError, KeyError, TypeError, ValueError):
        return lines
    return lines + [estimate_line(cfg, shape, aux_parameters(cfg))]


def aux_parameters(cfg: RunConfig) -> int:
    """Parameters of the HF model directories the algorithm names (`AlgoSpec.files` of kind "hf_dir", e.g.
    PURE's PRM with pure.prm=hf), each loaded whole on every rank; one whose config.json is unreadable counts 0."""
    import algos
    from configs.loading import value_of

    total = 0
    for key, kind in algos.get(cfg.algo).files(cfg):
        if kind == "hf_dir":
            with contextlib.suppress(OSError, KeyError, TypeError, ValueError):
                total += ModelShape.read(value_of(cfg, key)).parameters()
    return total
