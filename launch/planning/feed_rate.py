"""Before anything starts: how many actors can one learner feed? (review gpu_path_3 F5: 32 actors on a 7B were
about 2-4x more than one 8-GPU learner consumes; more actors then buy staleness headroom, not speed, and every
push pauses all of them.)

Both sides are estimated from the model's shape (config.json: `ModelShape.parameters`, `kv_bytes_per_token`) and
the GPU type Ray reports for each side's nodes (`accelerator_type:<X>`; the smallest card of each type, as
`engine_load.GPU_GIB` does), in tokens a second:

    learner  T_L = ranks × peak × LEARNER_MFU / (2 × (passes × P + Σ P_aux))
             passes = 3 (forward, and a backward of twice its cost) + 1 with activation checkpointing (the
             recompute); P_aux: the frozen models the learner runs a forward of (a reference, PURE's HF PRM)
    engine   T_E = B / step,  step = (P × d + B × L̄ × kv) / (tp × bandwidth × DECODE_BW_SHARE)
             a decode step reads every weight (P × d bytes) and the KV of each of its B sequences (L̄ tokens of
             kv bytes) once: memory-bound, so its time is those bytes over the GPUs' memory bandwidth;
             B = the sequences the run keeps in flight per engine (`configs.concurrency`: its credit share
             and KV capacity); L̄ = prompt + response / 2 tokens, the mean context of a sequence decoding from
             its prompt to its full length (the limits, not the run's real lengths: it errs toward long
             contexts, i.e. slow engines)
    actors the learner can feed = (T_L / (prompt + response)) / (T_E / response)
             samples a second the learner trains on (every token of a sample) over those one engine makes
             (its response tokens; prefill is left out, a few % of a decode-bound engine's time)

Assumptions, stated where they are used: LEARNER_MFU 0.35 (FSDP2 on a 7B with 16 k-token micro-batches; veRL's
and OpenRLHF's reports of 30-45 % model FLOPs utilisation), DECODE_BW_SHARE 0.6 (what a batched decode step reaches
of the HBM bandwidth in vLLM's memory-bound kernels), dense bf16 peaks and bandwidths from the vendors' data
sheets (`GPU_SPEC`, the smallest card of each type). An estimate within about 2x: the line warns only when the
run asks for more than WARN_FACTOR times what it finds. Qwen2.5-7B, PURE's batch 64 x 8 on 8 H100 learner ranks
and H100 engines: T_L ≈ 35 k tokens/s, T_E ≈ 5.5 k tokens/s, about 4.7 actors fed
(tests/launch/test_feed_rate.py works it out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from configs.schema import RunConfig
from launch.planning.engine_load import engine_kv_tokens, gpu_engine_load, gpu_of
from launch.planning.memory_estimate import aux_shapes
from launch.planning.model_shape import DTYPE_BYTES, ModelShape

LEARNER_MFU = 0.35
DECODE_BW_SHARE = 0.6
WARN_FACTOR = 3.0
GPU_SPEC = {  # (dense bf16 TFLOP/s, memory bandwidth TB/s) of the smallest card of each type Ray names
    "A10G": (70.0, 0.6), "L4": (121.0, 0.3), "L40S": (362.0, 0.864), "A100": (312.0, 1.555),
    "H100": (756.0, 2.0), "H200": (989.0, 4.8),
}


def gpu_spec(nodes: Sequence) -> tuple[float, float, str] | None:
    """(peak FLOP/s, bandwidth B/s, type) of the slowest known GPU type among `nodes`, None when none is known."""
    found = [(*GPU_SPEC[t], t) for n in nodes if (g := gpu_of(n.custom)) is not None and (t := g[1]) in GPU_SPEC]
    if not found:
        return None
    tflops, tbps, name = min(found)
    return tflops * 1e12, tbps * 1e12, name


def learner_tokens_per_s(cfg: RunConfig, shape: ModelShape, peak_flops: float) -> float:
    """T_L (module docstring)."""
    import algos

    ac = cfg.learner.activation_checkpointing
    passes = 3 + (1 if ac == "auto" or ac else 0)
    aux = sum(s.parameters() for s in aux_shapes(cfg))
    if "ref_logprobs" in algos.get(cfg.algo).requires(cfg):
        aux += shape.parameters()
    return cfg.learner.world_size * peak_flops * LEARNER_MFU / (2 * (passes * shape.parameters() + aux))


def engine_tokens_per_s(cfg: RunConfig, shape: ModelShape, bandwidth: float, sequences: int) -> float:
    """T_E of one engine decoding `sequences` sequences at once (module docstring)."""
    d = DTYPE_BYTES[cfg.model.resolved_dtype(gpu=True)]
    context = cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens / 2
    step_bytes = shape.parameters() * d + sequences * context * shape.kv_bytes_per_token(d)
    return sequences / (step_bytes / (cfg.rollout.engine.tensor_parallel_size * bandwidth * DECODE_BW_SHARE))


def actors_fed(cfg: RunConfig, shape: ModelShape, learner_tps: float, engine_tps: float) -> float:
    """Actors whose samples the learner trains on as fast as they come (module docstring)."""
    prompt, response = cfg.data.max_prompt_tokens, cfg.rollout.max_response_tokens
    return (learner_tps / (prompt + response)) / (engine_tps / response)


def feed_note(cfg: RunConfig, rank_nodes: Sequence, actor_nodes: Sequence, actors: int) -> str | None:
    """The start line of a resolved GPU run: how many actors its learner can feed, a warning when it asks for
    more than WARN_FACTOR times that; None for CPU runs, the built-in model, or GPU types Ray does not name."""
    if not actors or not cfg.rollout.gpus_per_actor or not cfg.learner.gpus_per_rank or cfg.model.path is None:
        return None
    try:
        shape = ModelShape.read(cfg.model.path)
    except (OSError, KeyError, TypeError, ValueError):
        return None
    learner_gpu, engine_gpu = gpu_spec(rank_nodes), gpu_spec(actor_nodes)
    if learner_gpu is None or engine_gpu is None:
        return None
    gib = min((g[0] for n in actor_nodes if (g := gpu_of(n.custom)) is not None), default=None)
    load = gpu_engine_load(cfg, engine_kv_tokens(cfg, shape, gib), actors)
    sequences = load.held() * load.n
    t_l = learner_tokens_per_s(cfg, shape, learner_gpu[0])
    t_e = engine_tokens_per_s(cfg, shape, engine_gpu[1], sequences)
    fed = actors_fed(cfg, shape, t_l, t_e)
    said = (f"[plan] the learner can feed about {fed:.1f} actor(s) (estimate): {cfg.learner.world_size} "
            f"{learner_gpu[2]} rank(s) train ~{t_l / 1e3:.0f} k tokens/s, one {engine_gpu[2]} engine decodes "
            f"~{t_e / 1e3:.1f} k tokens/s with {sequences} sequences in flight "
            f"(launch/planning/feed_rate.py states the formula)")
    if actors <= WARN_FACTOR * fed:
        return f"{said}; this run has {actors}"
    return (f"{said}; this run asks for {actors}: more actors than that buy staleness headroom, not speed, and "
            f"every push pauses all of them — consider --actors {max(1, math.ceil(fed))} or a larger learner "
            "(learner.world_size)")
