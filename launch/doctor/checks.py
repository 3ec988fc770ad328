"""The checks of `algo-train doctor` (launch.doctor.command) other than the weight path: each turns what was found
into `Check` rows with the fix for a failure. `config_checks` is pure (tests call it with declared nodes);
`node_checks` and `learner_checks` run probes through Ray on the nodes the run would use."""

from __future__ import annotations

from pathlib import Path

from configs.concurrency import engine_load
from configs.schema import RunConfig
from launch.doctor.probes import nccl_bootstrap_interface
from launch.doctor.report import Check
from launch.planning.engine_load import gpu_engine_load, idle_warning
from launch.planning.memory_estimate import LearnerMemory, micro_batch_tokens, run_memory
from launch.planning.model_shape import DTYPE_BYTES, ModelShape, context_problem
from launch.planning.resources import actor_count
from launch.planning.versions import VLLM, vllm_problem

GIB = 2**30
ENGINE_RESERVE_GIB = 4.0  # a GPU engine's share kept free of KV: CUDA graphs, activations, push transients


def model_dir(cfg: RunConfig) -> Path:
    """The run's model directory; for the built-in model its untrained base (same architecture, no warm-up)."""
    if cfg.model.path is not None:
        return Path(cfg.model.path)
    from launch.prep.model_prep import base_model_dir

    return base_model_dir(cfg)


def _dtype_bytes(cfg: RunConfig, gpu: bool) -> int:
    return DTYPE_BYTES[cfg.model.resolved_dtype(gpu)]


def kv_checks(cfg: RunConfig, shape: ModelShape, node: str, gpu_bytes: int | None) -> list[Check]:
    """KV tokens one engine on `node` gets, against one whole sequence (vLLM refuses to start below it) and
    against the sequences in flight (below that, vLLM preempts and recomputes); on a GPU node also whether the
    staleness credit and the actor count leave the engine mostly idle (`configs.concurrency`, the planner's
    rule). `gpu_bytes`: the memory of one of the node's GPUs, None on a CPU node."""
    row, tokens = _kv_row(cfg, shape, node, gpu_bytes)
    idle = idle_warning(cfg, tokens, actor_count(cfg)) if gpu_bytes is not None and tokens is not None else None
    return [row] + ([Check(node, "engine load", "WARN", *idle)] if idle else [])


def _kv_row(cfg: RunConfig, shape: ModelShape, node: str, gpu_bytes: int | None) -> tuple[Check, int | None]:
    """`kv_checks`' first row, and the KV tokens it estimated (None: not estimated)."""
    r = cfg.rollout
    seq = cfg.data.max_prompt_tokens + r.max_response_tokens
    gpu = gpu_bytes is not None
    per_token = shape.kv_bytes_per_token(_dtype_bytes(cfg, gpu))
    util = r.engine.gpu_memory_utilization
    if gpu and util is not None:
        weights = shape.parameters() * _dtype_bytes(cfg, gpu) / r.engine.tensor_parallel_size
        budget = util * gpu_bytes - weights - ENGINE_RESERVE_GIB * GIB
        how = f"{util:g} of the GPU − weights − ~{ENGINE_RESERVE_GIB:g} GiB (estimate; the engine logs its own)"
    elif (gib := r.resolved_kv_cache_gib(gpu)) is not None:
        budget = gib * GIB
        how = f"rollout.kv_cache_gib={gib:g}"
    else:  # a GPU engine sized by a memory share on a node whose GPUs were not read
        return Check(node, "kv cache", "WARN", "the node reports no GPU memory: KV tokens not estimated",
                     "check that the node's GPUs are visible to Ray (ray status)"), None
    tokens = int(max(budget, 0) // per_token)
    load = (gpu_engine_load(cfg, tokens, actor_count(cfg)) if gpu
            else engine_load(cfg, gpu=False, actors=actor_count(cfg), kv_tokens=tokens))
    want = load.prompts * r.n * seq  # prompts_in_flight as the run resolves it (auto included)
    found = (f"{tokens:,} KV tokens per engine ({how}; {per_token:,} B/token); one sequence needs {seq:,}, "
             f"{load.prompts} prompts × {r.n} samples in flight need {want:,}")
    if tokens < seq:
        return Check(node, "kv cache", "FAIL", found,
                     "raise rollout.kv_cache_gib (CPU) or rollout.engine.gpu_memory_utilization (GPU), or lower "
                     "data.max_prompt_tokens + rollout.max_response_tokens"), tokens
    if tokens < want:
        return Check(node, "kv cache", "WARN", found,
                     f"engines will preempt and recompute: lower rollout.prompts_in_flight to "
                     f"{max(1, tokens // (r.n * seq))} or give the KV cache more memory"), tokens
    return Check(node, "kv cache", "PASS", found), tokens


def read_shape(cfg: RunConfig) -> ModelShape:
    return ModelShape.read(model_dir(cfg))


def config_checks(cfg: RunConfig, shape: ModelShape) -> list[Check]:
    """Checks of the configuration against the model's config.json."""
    where = str(cfg.model.path or "the built-in model")
    problem = context_problem(shape, cfg.data.max_prompt_tokens, cfg.rollout.max_response_tokens, where)
    if problem:
        found, fix = problem.split(" — ")
        return [Check("run", "context", "FAIL", found, fix)]
    seq = cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens
    return [Check("run", "context", "PASS", f"{seq:,} tokens per sequence; the model's context is "
                                            f"{shape.context or 'not stated'}")]


def plan_check(cfg: RunConfig, cluster) -> Check:
    """The run's own resource plan on `cluster`'s nodes (a `launch.planning.cluster.ClusterInfo`): room for every
    learner rank, actor and teacher engine (`launch.planning.resources.plan`, which the run repeats at start)."""
    from launch.planning.resources import ResourceError, plan

    try:
        p = plan(cfg, cluster.nodes, joined=cluster.cluster, driver=cluster.driver)
    except ResourceError as e:
        found, _, fix = str(e).removeprefix("cannot start this run: ").partition(" Fix: ")
        return Check("run", "resources", "FAIL", found, fix.rstrip("."))
    return Check("run", "resources", "PASS", p.summary())


def hosts_actors(cfg: RunConfig, resources: dict) -> bool:
    """True when a node with these Ray resources can host an actor (its custom resources, a GPU if needed)."""
    need = dict(cfg.rollout.custom_resources)
    if cfg.rollout.gpus_per_actor not in ("auto", 0, 0.0):
        need["GPU"] = float(cfg.rollout.gpus_per_actor)
    return all(resources.get(k, 0) >= v for k, v in need.items())


def write_probe(cfg: RunConfig, token: str) -> Path:
    """A file beside the run folder holding `token`, for every node to read (shared storage)."""
    from launch.commands.train import run_dir_for

    parent = run_dir_for(cfg).absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    probe = parent / f".doctor-{token}"
    probe.write_text(token)
    return probe


def run_paths(cfg: RunConfig) -> list[str]:
    d = cfg.data
    return [str(p) for p in (cfg.model.path, d.path, d.eval_path, d.demos) if p]


def facts_checks(node: str, facts: dict, driver: dict, cluster: bool, gpus: bool, learner_ranks: int) -> list[Check]:
    """Rows for one node's `launch.doctor.probes.node_facts` against the driver's (`learner_ranks`:
    learner.world_size, which decides whether the interface variables are needed)."""
    out = []
    v = facts["versions"]
    vllm_msg = vllm_problem(lambda d: _version_of(v, d))
    differ = [f"{k} {v.get(k)} (driver {driver['versions'].get(k)})" for k in ("torch", "ray", "transformers")
              if v.get(k) != driver["versions"].get(k)]
    if vllm_msg:
        out.append(Check(node, "versions", "FAIL", vllm_msg.split(" — ")[0], vllm_msg.split(" — ")[-1]))
    elif differ:
        out.append(Check(node, "versions", "FAIL", "differs from the driver: " + ", ".join(differ),
                         "install the same versions on every node (bash scripts/setup.sh from the same checkout)"))
    else:
        have = ", ".join(f"{k} {v[k]}" for k in sorted(v))
        out.append(Check(node, "versions", "PASS", f"{have} (vLLM {VLLM} tested)"))
    if facts["shared"] is False or facts["missing"]:
        what = []
        if facts["shared"] is False:
            what.append("cannot read the file the driver wrote beside the run folder")
        if facts["missing"]:
            what.append("missing: " + ", ".join(facts["missing"]))
        out.append(Check(node, "storage", "FAIL", "; ".join(what),
                         "put the run folder, model and data on a filesystem every node mounts at the same path"))
    else:
        out.append(Check(node, "storage", "PASS", "reads the driver's file and every path the run names"))
    out.append(_iface_check(node, facts["ifaces"], cluster, gpus, learner_ranks, facts.get("nccl_ifaces")))
    return out


def _version_of(versions: dict, dist: str) -> str:
    from importlib import metadata

    if dist not in versions:
        raise metadata.PackageNotFoundError(dist)
    return versions[dist]


def _iface_check(node: str, ifaces: dict, cluster: bool, gpus: bool, learner_ranks: int,
                 nccl_ifaces: list | None = None) -> Check:
    """GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME on GPU nodes) of the node's Ray. A variable naming an
    interface the node lacks fails whatever the run (gloo and NCCL bind only the interfaces named). Unset,
    GLOO_SOCKET_IFNAME matters only to a learner of several ranks on a cluster: its ranks' process group binds
    the address the hostname resolves to (often loopback). A one-rank learner makes no sockets for its group
    (`learner.distributed.init_distributed`), and the gloo weight sync binds the learner node's address as Ray
    reports it. NCCL_SOCKET_IFNAME unset on a GPU node: NCCL's bootstrap binds an interface of its own choice
    (`probes.nccl_bootstrap_interface`: `ib*` first), whose address the unique id carries to every engine; on a
    multi-homed node that may not be the address Ray advertises (`node`), which the other nodes can reach:
    WARN, naming the interface of Ray's address (review gpu_path_3 F9)."""
    if not cluster:
        return Check(node, "interfaces", "PASS", "one machine: every service on loopback")
    needed = ["GLOO_SOCKET_IFNAME"] + (["NCCL_SOCKET_IFNAME"] if gpus else [])
    unset = [v for v in needed if not ifaces.get(v, (None, None))[0]]
    absent = [f"{v}={ifaces[v][0]}" for v in needed if ifaces.get(v, (None, None))[1] is False]
    if absent:
        return Check(node, "interfaces", "FAIL", "no such interface on this node: " + ", ".join(absent),
                     "name the cluster network's interface of this node, then restart its `ray start`")
    nccl = nccl_bootstrap_interface(nccl_ifaces) if "NCCL_SOCKET_IFNAME" in unset and nccl_ifaces else None
    if nccl is not None and nccl[1] != node:
        rays = next((name for name, ip in nccl_ifaces if ip == node), None)
        return Check(node, "interfaces", "WARN", f"NCCL_SOCKET_IFNAME not set: NCCL's bootstrap would bind "
                     f"{nccl[0]} ({nccl[1]}), not this node's address as Ray advertises it ({node}): engines on "
                     "other nodes may never reach it (the weight-sync rendezvous then hangs for "
                     "weight_sync.connect_timeout_s)", f"export NCCL_SOCKET_IFNAME={rays or 'IFACE'} before `ray "
                     f"start` on every node (the interface of {node})")
    said = f"; NCCL's bootstrap binds {nccl[0]} ({nccl[1]}), Ray's address" if nccl is not None else ""
    if unset and learner_ranks > 1:
        return Check(node, "interfaces", "WARN", f"{', '.join(unset)} not set in Ray's environment: the "
                     f"{learner_ranks} learner ranks' process group binds the address the hostname resolves to "
                     f"(often loopback){said}", f"export {unset[0]}=IFACE before `ray start` on every node")
    if unset:
        return Check(node, "interfaces", "PASS", f"{', '.join(unset)} not set, not needed: one learner rank "
                     f"(no sockets for its group; the weight sync binds the learner node's address){said}")
    return Check(node, "interfaces", "PASS", ", ".join(f"{v}={ifaces[v][0]}" for v in needed))


def node_checks(cfg: RunConfig, shape: ModelShape, probe: Path, cluster: bool) -> list[Check]:
    """Run `node_facts` on every live node (a Ray task pinned to it), compare with the driver's, and check
    the KV cache an engine gets on each node that can host actors."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from launch.doctor.probes import node_facts

    paths = run_paths(cfg)
    token = probe.read_text()
    driver = node_facts(str(probe), token, paths)
    task = ray.remote(num_cpus=0)(node_facts)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(str(probe), token, paths) for n in nodes]
    out = []
    try:
        for n, facts in zip(nodes, ray.get(refs, timeout=120)):
            res = n.get("Resources", {})
            out += facts_checks(n["NodeManagerAddress"], facts, driver, cluster, res.get("GPU", 0) > 0,
                                cfg.learner.world_size)
            if hosts_actors(cfg, res):
                gpu = facts["gpu_bytes"][0] if facts["gpu_bytes"] and cfg.rollout.gpus_per_actor else None
                out += kv_checks(cfg, shape, n["NodeManagerAddress"], gpu)
    finally:
        probe.unlink(missing_ok=True)
    return out


def learner_estimate(cfg: RunConfig, shape: ModelShape, probe: dict, gpu: bool) -> tuple[LearnerMemory, str]:
    """(the run's memory budget, how) of a learner rank: the start line's (`memory_estimate.run_memory`: sharded
    state, the root unit and its gradients, prefetched layers, the log-prob head chunk, the reference model,
    the HF models the algorithm loads, rank 0's send buffers and pinned staging), with the activations of
    one micro-batch at the probe's measured bytes per token instead of the formula."""
    tokens = micro_batch_tokens(cfg, gpu)
    ac = cfg.learner.activation_checkpointing
    ac = gpu if ac == "auto" else bool(ac)
    per_layer = probe["per_layer_token_bytes"]
    if ac:  # a checkpointed layer keeps its input; one layer's activations live during its recompute
        kept = shape.hidden * _dtype_bytes(cfg, gpu)
        acts = tokens * (probe["head_token_bytes"] + shape.layers * kept + per_layer)
    else:
        acts = tokens * (probe["head_token_bytes"] + shape.layers * per_layer)
    m = run_memory(cfg, shape, gpu, activations=acts)
    items = ", ".join(f"{k} {b / GIB:.2f}" for k, b in m.every_rank + m.rank0_only)
    how = (f"{per_layer / 1024:.1f} KiB/token/layer + {probe['head_token_bytes'] / 1024:.1f} KiB/token head "
           f"(measured, {probe['device']}); micro-batch {tokens:,} tokens × {shape.layers} layers"
           f"{' (checkpointed)' if ac else ''}; rank 0: {items} GiB")
    return m, how


def learner_checks(cfg: RunConfig, tokens: int) -> list[Check]:
    """Measure the learner's bytes per token at the model's real width and vocabulary on a learner node, and
    check rank 0's whole budget against its GPU and its pinned staging against the node's memory."""
    import ray

    from launch.doctor.probes import learner_memory, model_config

    config = model_config(str(model_dir(cfg)))
    shape = ModelShape.from_config(config)
    gpu = bool(cfg.learner.gpus_per_rank)
    device = "cuda" if gpu else "cpu"
    dtype = cfg.model.resolved_dtype(gpu)
    opts = {"num_gpus": 1, "num_cpus": 1} if gpu else {"num_cpus": 1}
    if cfg.learner.custom_resources:
        opts["resources"] = {k: min(v, 1e-3) for k, v in cfg.learner.custom_resources.items()}
    task = ray.remote(**opts)(learner_memory)
    try:
        chunk = cfg.learner.resolved_logprob_chunk_tokens(gpu)
        probe = ray.get(task.remote(config, tokens, dtype, chunk, device), timeout=300)
    except Exception as e:  # the row says what failed; the other checks still print
        return [Check("learner", "learner memory", "FAIL", f"the probe failed: {str(e).strip()[:300]}",
                      "run `algo-train doctor --verbose` and read the learner node's Ray log")]
    m, how = learner_estimate(cfg, shape, probe, gpu)
    return [memory_row(m, how, _learner_capacity(gpu), probe.get("host_bytes"), cfg.weight_sync.mode)]


PINNED_SHARE = 0.5  # of a node's memory that rank 0's pinned staging may take: Ray's object store takes
# 30 % by default, and the learner process, its data and the page cache need the rest


def memory_row(m: LearnerMemory, how: str, cap: float | None, host: float | None, mode: str) -> Check:
    """The learner-memory row: rank 0's GPU budget against `cap` (its GPU's memory; None on CPU) and its
    pinned staging against `host` (the node's memory; None: not read). FAIL names the fix."""
    need = m.total(rank0=True)
    pinned = sum(b for _, b in m.rank0_host)
    found = (f"{how}; rank 0 needs ≈ {need / GIB:.1f} GiB" + (f" of {cap / GIB:.0f} GiB" if cap else "")
             + f", and {pinned / GIB:.1f} GiB of {'pinned ' if cap else ''}host memory for the push in flight ({mode} pushes)"
             + (f" of the node's {host / GIB:.0f} GiB" if host else ""))
    if cap and need > 0.9 * cap:
        return Check("learner", "learner memory", "FAIL", found,
                     "set learner.micro_batch_tokens lower (e.g. 16384), learner.logprob_chunk_tokens=1024, "
                     "activation checkpointing on, or more learner ranks")
    if host and pinned > PINNED_SHARE * host:
        return Check("learner", "learner memory", "FAIL", found,
                     ("set weight_sync.mode=full (half the pinned staging), or " if mode == "delta" else "")
                     + "put learner rank 0 on a node with more memory (pinned staging holds the pushed weights)")
    return Check("learner", "learner memory", "PASS", found)


def _learner_capacity(gpu: bool) -> float | None:
    """Memory of one learner device: a GPU's total (the first learner node's), else None on CPU."""
    import ray

    if not gpu:
        return None

    @ray.remote(num_gpus=1, num_cpus=0)
    def total() -> int:
        import torch

        return torch.cuda.get_device_properties(0).total_memory

    return float(ray.get(total.remote(), timeout=120))
