"""What a run's learner ranks will need, estimated from the model's config.json before anything starts.

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
    reference model    frozen(P)             when the algorithm asks for reference log-probs
    PURE's HF PRM      frozen(P_prm)         pure.prm=hf (any HF directory an algorithm names in
                                             `AlgoSpec.files` counts so), sharded like the reference
    teacher            frozen(P_teacher)     teacher.path, when the algorithm asks for the teacher's
                                             log-probs (--algo opd), sharded like the reference; nothing
                                             with teacher.scoring=engine (its own vLLM engine scores)
  A LoRA run (model.lora; Q: adapter parameters, `ModelShape.lora_parameters`) replaces the sharded state
  by the frozen fp32 base, 4 × P / world, and the adapters' 16 × Q / world; the embedding and head are
  frozen (no root gradients), and the reference is the policy with its adapters off (nothing more). Its
  pushes carry the adapter alone, Q × d (`model.lora.sync: adapter`), or the merged base, P × d, as a full
  run's (`sync: merged`).
  frozen(P) = P × d / world + R × d: a frozen model sharded with FSDP2 over the ranks, whose root unit
  (its embedding and head) is whole while it runs; P × d on a world of one (unsharded).
  rank 0 only, on the GPU:
    send buffers       (slots + 1) × max(bucket, largest tensor)   vLLM's packed producer (2 slots): one slot's
                                             bucket in flight while the other holds the next tensor's device
                                             copy and its torch.cat (`packed_tensor.pack_tensors`)
  rank 0 only, in pinned host memory (`weightsync.staging`: nothing of a push stays on the GPU):
    push staging       `pinned_host_bytes`: the payload P × d in full mode (Q × d for adapter pushes), twice that in delta mode
                                             (the patch arena beside the payload, which is the baseline)

d = bytes of model.dtype, h = hidden size, V = vocabulary. `activations` (the layer inputs and the one
layer) may be given measured instead (`algo-train doctor` measures bytes per token on a learner node);
everything else is this arithmetic, which the run's start line and the doctor share. Not counted: PRIME's
trainable PRM, the PRM's forward transients (batched by the same token budget as the policy's
micro-batches, and not alive while the policy trains), CUDA and NCCL workspaces, allocator
fragmentation; the gathered copies of a push waiting for their copy to host during `prepare` (between steps,
up to the payload in the worst case; review gpu_path_3 F10). Qwen2.5-7B on 8 ranks, 16 k-token micro-batches,
chunk 4096, full pushes: rank 0 ≈ 43 GB
on its GPU (the appendix's 57 GB less the 15.2 GB payload, which now waits in host memory) plus 15.2 GB
of pinned host memory, 30.5 GB in delta mode (tests/launch/test_memory_estimate.py works it out).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from configs.schema import RunConfig
from launch.planning.model_shape import DTYPE_BYTES, ModelShape

GB = 1e9
PRODUCER_SLOTS = 2  # the NCCL plane's packed buffers (weightsync.nccl.plane.DEFAULT_NUM_BUFFERS, vLLM's default)


@dataclass(frozen=True)
class LearnerMemory:
    """(what, bytes) on every rank's GPU, on rank 0's only, and in rank 0's pinned host memory."""

    every_rank: tuple[tuple[str, float], ...]
    rank0_only: tuple[tuple[str, float], ...]
    rank0_host: tuple[tuple[str, float], ...]

    def total(self, rank0: bool) -> float:
        return sum(b for _, b in self.every_rank) + (sum(b for _, b in self.rank0_only) if rank0 else 0.0)


def learner_memory(shape: ModelShape, *, world: int, tokens: int, chunk_tokens: int, checkpointing: bool,
                   dtype_bytes: int = 2, delta: bool = False, reference: bool = False,
                   aux: tuple[ModelShape, ...] = (), teacher: ModelShape | None = None,
                   bucket_bytes: float = 256 * 2**20, activations: float | None = None,
                   lora_params: int | None = None, adapter_push: bool = False) -> LearnerMemory:
    """The module docstring's budget for one rank (pure arithmetic). aux: the frozen HF models the
    algorithm loads (PURE's PRM); teacher: the distillation teacher's shape (None: no teacher);
    activations: measured bytes of one micro-batch's activations (None: the formula); lora_params: the
    adapters' parameters of a LoRA run (None: every weight trains); adapter_push: its pushes carry the adapter
    alone (Q × d, always whole)."""
    p, d, h = shape.parameters(), dtype_bytes, shape.hidden
    root = shape.vocab * h * (1 if shape.tied else 2)
    layer = (p - root - h) / shape.layers
    one_layer = (4 * h + 2 * shape.intermediate) * d
    kept = shape.layers * h * d if checkpointing else shape.layers * one_layer
    acts = tokens * (kept + one_layer) if activations is None else activations

    def frozen(s: ModelShape) -> float:
        whole = s.parameters() * d
        return whole if world == 1 else whole / world + s.vocab * s.hidden * (1 if s.tied else 2) * d

    if lora_params is None:
        state = [("fp32 state", 16 * p / world), ("embedding/head", root * d), ("their grads", root * (d + 4))]
    else:
        state = [("frozen fp32 base", 4 * p / world), ("adapter state", 16 * lora_params / world),
                 ("embedding/head", root * d)]
    every = [*state, ("2 layers", 2 * layer * d), ("activations", acts),
             ("log-prob head", 4 * chunk_tokens * shape.vocab * 4)]
    if reference and lora_params is None:
        every.append(("reference", frozen(shape)))
    every += [("HF PRM", frozen(s)) for s in aux]
    if teacher is not None:
        every.append(("teacher", frozen(teacher)))
    rank0 = [("send buffers", (PRODUCER_SLOTS + 1) * max(bucket_bytes, shape.vocab * h * d))]
    adapter_push = adapter_push and lora_params is not None
    host = [("push staging", pinned_host_bytes(lora_params * d, False) if adapter_push
             else pinned_host_bytes(p * d, delta))]
    return LearnerMemory(tuple(every), tuple(rank0), tuple(host))


def pinned_host_bytes(payload_bytes: float, delta: bool) -> float:
    """Pinned host memory learner rank 0 stages its pushes in (`weightsync.staging.pinned_staging_bytes`:
    the payload's exact bytes, and as much again for a delta's patch arena; its 8 KiB per tensor left out)."""
    from weightsync.staging import pinned_staging_bytes

    return float(pinned_staging_bytes(int(payload_bytes), "delta" if delta else "full"))


def micro_batch_tokens(cfg: RunConfig, gpu: bool) -> int:
    """Tokens of one micro-batch at most on this device: the token cap, or the row cap × the longest row."""
    lc = cfg.learner
    rows = lc.micro_batch_samples * (cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens)
    cap = lc.resolved_micro_batch_tokens(gpu)
    return min(rows, cap) if cap else rows


def run_memory(cfg: RunConfig, shape: ModelShape, gpu: bool = True, activations: float | None = None) -> LearnerMemory:
    """`learner_memory` for a run's learner ranks on a GPU (`gpu`) or CPU: its micro-batch, log-prob chunk,
    checkpointing, dtype, push mode, reference model, the HF models its algorithm loads
    (`aux_shapes`) and its teacher (`teacher_shape`). The start line and `algo-train doctor` both count with this."""
    import algos

    lc = cfg.learner
    ac = lc.activation_checkpointing
    return learner_memory(shape, world=lc.world_size, tokens=micro_batch_tokens(cfg, gpu),
                          chunk_tokens=lc.resolved_logprob_chunk_tokens(gpu),
                          checkpointing=gpu if ac == "auto" else bool(ac),
                          dtype_bytes=DTYPE_BYTES[cfg.model.resolved_dtype(gpu)],
                          delta=cfg.weight_sync.mode == "delta",
                          reference="ref_logprobs" in algos.get(cfg.algo).requires(cfg),
                          aux=aux_shapes(cfg), teacher=teacher_shape(cfg),
                          bucket_bytes=cfg.weight_sync.bucket_mb * 2**20,
                          activations=activations, lora_params=lora_parameters(cfg, shape),
                          adapter_push=cfg.model.lora.adapter_sync)


def lora_parameters(cfg: RunConfig, shape: ModelShape) -> int | None:
    """The adapters' parameters of a LoRA run (`ModelShape.lora_parameters`); None when every weight trains."""
    lora = cfg.model.lora
    return shape.lora_parameters(lora.rank, lora.target_modules) if lora.enabled else None


def estimate_line(cfg: RunConfig, shape: ModelShape) -> str:
    """The start line of a resolved GPU run: rank 0 and the other ranks, then the items (GB)."""
    lc = cfg.learner
    tokens, chunk = micro_batch_tokens(cfg, gpu=True), lc.resolved_logprob_chunk_tokens(gpu=True)
    m = run_memory(cfg, shape)
    items = ", ".join(f"{k} {b / GB:.1f}" for k, b in m.every_rank + m.rank0_only)
    others = f", other ranks ≈ {m.total(False) / GB:.1f} GB" if lc.world_size > 1 else ""
    host = sum(b for _, b in m.rank0_host)
    return (f"[run] learner memory per rank (estimate): rank 0 ≈ {m.total(True) / GB:.1f} GB{others} — {items} GB "
            f"({tokens:,}-token micro-batches, log-prob chunk {chunk:,}; lower learner.micro_batch_tokens or "
            f"learner.logprob_chunk_tokens if that is near your GPU's memory)"
            + (f"; LoRA rank {cfg.model.lora.rank}: {lora_parameters(cfg, shape) / 1e6:.1f} M adapter parameters "
               "train, the base is frozen" if cfg.model.lora.enabled else "")
            + f"; rank 0 stages each push in "
            f"{host / GB:.1f} GB of pinned host memory "
            f"({'adapter' if cfg.model.lora.adapter_sync else cfg.weight_sync.mode} pushes)" + teacher_where(cfg))


def teacher_where(cfg: RunConfig) -> str:
    """Where the start line says a distillation teacher runs ('' when the algorithm reads none)."""
    import algos
    from algos.spec import TEACHER

    if cfg.teacher.path is None or TEACHER not in algos.get(cfg.algo).requires(cfg):
        return ""
    if cfg.teacher.scoring == "engine":
        return ("; the teacher scores on its own vLLM engine in the driver (teacher.scoring=engine; on GPUs of its own "
                "on the driver's node), not on the learner ranks")
    return "; the teacher runs on the learner ranks (counted above)"



def aux_shapes(cfg: RunConfig) -> tuple[ModelShape, ...]:
    """Shapes of the HF model directories the algorithm names (`AlgoSpec.files` of kind "hf_dir", e.g.
    PURE's PRM with pure.prm=hf), each sharded over the ranks like the reference model; one whose
    config.json is unreadable is left out (preflight refuses a run it breaks)."""
    import algos
    from configs.loading import value_of

    shapes = []
    for key, kind in algos.get(cfg.algo).files(cfg):
        if kind == "hf_dir":
            with contextlib.suppress(OSError, KeyError, TypeError, ValueError):
                shapes.append(ModelShape.read(value_of(cfg, key)))
    return tuple(shapes)


def teacher_shape(cfg: RunConfig) -> ModelShape | None:
    """The shape of teacher.path when the algorithm scores with a teacher (`algos.spec.TEACHER` in its
    requirements) on the learner ranks, sharded like the reference model; None without one, with
    teacher.scoring=engine (not on the learner ranks), or when its config.json is unreadable (preflight
    refuses such a teacher)."""
    if not teacher_where(cfg) or cfg.teacher.scoring == "engine":
        return None
    try:
        return ModelShape.read(cfg.teacher.path)
    except (OSError, KeyError, TypeError, ValueError):
        return None
