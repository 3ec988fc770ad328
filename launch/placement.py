"""CPU core placement for one machine: which cores each actor engine and each learner rank may use.

Learner ranks take whole cores from the top of the machine (ceil(cpus_per_rank) each); actors share
the remaining cores round-robin (two 0.5-CPU actors on a 2-core box share core 0, the learner gets
core 1). With GPUs, or when joining a Ray cluster (roles may land on other nodes), nothing is pinned.
"""

from __future__ import annotations

import math
import os


def plan_cores(num_actors: int, cpus_per_actor: float, ranks: int, cpus_per_rank: float,
               cores: list[int] | None = None) -> tuple[list[list[int]], list[list[int]]]:
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    per_rank = max(1, math.ceil(cpus_per_rank))
    rank_cores: list[list[int]] = []
    free = list(cores)
    for _ in range(ranks):
        take = free[-per_rank:] if len(free) > per_rank else free[-1:]
        rank_cores.append(take)
        if len(free) > len(take):
            free = free[: len(free) - len(take)]
    per_actor = max(1, math.floor(cpus_per_actor)) if cpus_per_actor >= 1 else 1
    actor_cores = []
    for i in range(num_actors):
        start = (i * per_actor) % len(free) if cpus_per_actor >= 1 else int(i * cpus_per_actor) % len(free)
        actor_cores.append([free[(start + k) % len(free)] for k in range(min(per_actor, len(free)))])
    return actor_cores, rank_cores
