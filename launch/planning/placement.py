"""Where the roles run: Ray placement groups (any run with Ray), and CPU cores (a single CPU machine).

`Placement` reserves one Ray bundle per role before any role starts (see its docstring and
`launch.planning.resources` for the bundle sizes and the strategies). `plan_rank_cores` pins on a single CPU
machine only: learner ranks take whole cores from the top of the machine (ceil(cpus_per_rank) each).
The actors are not pinned: their engines run on any core, so a core the learner leaves idle while it
waits for a batch generates (bench/RESULTS.md, "CPU sharing on one machine"). With GPUs, or on a
joined Ray cluster (roles land on other nodes), nothing is pinned.
"""

from __future__ import annotations

import math
import os
import time

from launch.planning.cluster import cluster_nodes
from launch.planning.resources import Plan, ResourceError


def plan_rank_cores(ranks: int, cpus_per_rank: float, cores: list[int] | None = None) -> list[list[int]]:
    """The cores of each learner rank: ceil(cpus_per_rank) whole cores each, from the top of `cores`
    (default: this process's); when they run out, the remaining ranks share the lowest core left."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    per_rank = max(1, math.ceil(cpus_per_rank))
    rank_cores: list[list[int]] = []
    free = list(cores)
    for _ in range(ranks):
        take = free[-per_rank:] if len(free) > per_rank else free[-1:]
        rank_cores.append(take)
        if len(free) > len(take):
            free = free[: len(free) - len(take)]
    return rank_cores


class Placement:
    """The run's Ray placement groups (`launch.planning.resources.Plan`): one for the learner ranks (STRICT_PACK
    when one node holds them all, else PACK), one for the actors (SPREAD), and with GPU teacher engines one on the
    driver's node for their GPUs (`teacher_devices`); every role then runs inside a bundle of its group
    (`strategy`). `reserve` waits until Ray has placed every group: a request Ray accepts but cannot place
    (another job holds the resources, a node left, or Ray packs differently than the check) stops the run
    after `timeout_s` instead of hanging in `ray.get`."""

    def __init__(self, plan: Plan, timeout_s: float):
        from ray.util.placement_group import placement_group

        self.plan, self.timeout_s = plan, timeout_s
        self.groups = {}
        self.leases: list = []  # the actors holding each teacher engine's GPUs (`teacher_devices`)
        if plan.teachers and plan.teacher_bundle.gpus:  # first, as the plan took them; a CPU teacher holds nothing
            # the engines run in the driver's process: on a cluster, pinned to its node (one machine has one node)
            here = {f"node:{plan.driver}": 0.001} if plan.driver else {}
            self.groups["teacher"] = placement_group([plan.teacher_bundle.ray_resources() | here] * plan.teachers,
                                                     strategy="STRICT_PACK", name="teacher")
        if plan.ranks:
            self.groups["learner"] = placement_group([plan.rank_bundle.ray_resources()] * plan.ranks,
                                                     strategy=plan.rank_strategy, name="learner")
        if plan.actors:
            self.groups["actors"] = placement_group([plan.actor_bundle.ray_resources()] * plan.actors,
                                                    strategy="SPREAD", name="actors")
        self.more_actors: list = []  # groups reserved when the run was scaled up (`grow_actors`)

    def reserve(self) -> None:
        """Wait for every group; on the deadline remove them and raise `ResourceError` with the figures."""
        deadline = time.monotonic() + self.timeout_s
        pending = [name for name, pg in self.groups.items()
                   if not pg.wait(timeout_seconds=max(0.0, deadline - time.monotonic()))]
        if pending:
            message = self._unplaced(pending)
            self.remove()
            raise ResourceError(message)

    def teacher_devices(self) -> list[str | None]:
        """CUDA_VISIBLE_DEVICES of each teacher engine (`Plan.teachers`, in the order `launch.loop.graph` starts them):
        the GPUs Ray gave its bundle, read by a small actor that holds them until `remove` (None for a CPU
        teacher: its engine uses no GPU)."""
        import ray

        pg = self.groups.get("teacher")
        if pg is None:
            return [None] * self.plan.teachers
        lease = ray.remote(num_cpus=0)(_GpuLease)
        self.leases = [lease.options(num_gpus=self.plan.teacher_bundle.gpus,
                                     scheduling_strategy=self.strategy("teacher", i)).remote()
                       for i in range(self.plan.teachers)]
        ids = ray.get([h.gpu_ids.remote() for h in self.leases], timeout=self.timeout_s)
        return [",".join(str(g) for g in gpus) for gpus in ids]

    def _unplaced(self, pending: list[str]) -> str:
        import ray

        p = self.plan
        asked = (f"{p.ranks} learner rank(s) × [{p.rank_bundle.describe()}] {p.rank_strategy}, "
                 f"{p.actors} actor(s) × [{p.actor_bundle.describe()}] SPREAD"
                 + (f", {p.teachers} teacher engine(s) × [{p.teacher_bundle.describe()}] on the driver's node"
                    if "teacher" in self.groups else ""))
        free = ray.available_resources()
        free_s = ", ".join(f"{k} {free.get(k, 0.0):g}" for k in ("CPU", "GPU")) or "nothing"
        nodes = "; ".join(n.describe() for n in cluster_nodes())
        return (f"Ray accepted the placement groups but could not place the {' and the '.join(pending)} "
                f"within {self.timeout_s:g} s (placement_timeout_s): asked {asked}; the nodes have {nodes}; "
                f"free in the cluster now: {free_s}. Another job may hold resources or a node may have left: "
                "free them or lower the request (--actors N, learner.world_size), or raise "
                "--set placement_timeout_s=S while nodes are still joining.")

    def strategy(self, group: str, bundle: int = -1):
        """Scheduling strategy that runs a role in bundle `bundle` (-1 = any free one) of `group`; an actor
        numbered past the first group runs in the group `grow_actors` reserved for it."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg = self.groups[group]
        if group == "actors" and bundle >= self.plan.actors:
            pg, bundle = self._grown(bundle)
        return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)

    def _grown(self, actor: int) -> tuple[object, int]:
        """(group, bundle) of actor `actor` among the groups `grow_actors` reserved."""
        first = self.plan.actors
        for pg in self.more_actors:
            if actor < first + pg.bundle_count:
                return pg, actor - first
            first += pg.bundle_count
        raise ValueError(f"actor {actor} has no bundle reserved (grow_actors first)")

    def actor_room(self) -> int:
        """How many actors the reserved groups hold."""
        return self.plan.actors + sum(pg.bundle_count for pg in self.more_actors)

    def grow_actors(self, total: int):
        """Reserve bundles for actors up to `total` (a run scaled up: `launch.state.scaling`) in one more
        SPREAD group, without waiting: roles put in it wait in Ray's queue until Ray places it. Returns the
        new group (None when the reserved ones hold `total` already), whose `wait` says when it is placed."""
        from ray.util.placement_group import placement_group

        if total <= self.actor_room():
            return None
        pg = placement_group([self.plan.actor_bundle.ray_resources()] * (total - self.actor_room()),
                             strategy="SPREAD", name=f"actors-{len(self.more_actors) + 1}")
        self.more_actors.append(pg)
        return pg

    def forget(self, pg) -> None:
        """Give back a group `grow_actors` reserved (its scale-up was cancelled); it must be the last one."""
        from ray.util.placement_group import remove_placement_group

        assert self.more_actors and self.more_actors[-1] is pg, "only the last group grown can be given back"
        remove_placement_group(self.more_actors.pop())

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in [*self.groups.values(), *self.more_actors]:
            remove_placement_group(pg)  # and the teacher's GPU leases in it
        self.groups, self.more_actors, self.leases = {}, [], []


class _GpuLease:
    """Holds a teacher engine's GPUs in its bundle for the run; the engine itself runs in the driver's process."""

    def gpu_ids(self) -> list:
        import ray

        return ray.get_gpu_ids()
