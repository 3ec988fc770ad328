"""The cluster path without a cluster: placement plans on declared nodes, "auto" resolution, finding the
Ray to join, and the vLLM engine settings a GPU run gets. Pure functions; the real-Ray test is at the end."""

import os
import re
import time
from types import SimpleNamespace

import pytest

from actors.engine import EngineSpec
from configs.loading import ConfigError, resolve
from launch.planning.cluster import ClusterInfo, find_cluster, nodes_from_ray, probe
from launch.planning.resources import Node, ResourceError, plan, resolve_auto


def gpu_nodes(count: int, gpus: float = 8, cpus: float = 96, mem: float = 1000, **custom) -> list[Node]:
    return [Node(f"10.0.0.{i + 1}", cpus, gpus, mem, dict(custom)) for i in range(count)]


def pure(actors: int, ranks: int, *overrides: str):
    return resolve("pure", flags={"rollout.num_actors": actors, "learner.world_size": ranks},
                   overrides=["learner.batch_prompts=8", *overrides])


def test_32_actors_and_8_ranks_on_five_8_gpu_nodes():
    p = plan(pure(32, 8), gpu_nodes(5))
    # auto: 1 GPU per actor (tensor_parallel_size 1) and per rank; 8 + 32 = 40 GPUs = 5 × 8
    assert p.rank_bundle.ray_resources() == {"CPU": 1.0, "GPU": 1.0}
    assert p.actor_bundle.ray_resources() == {"CPU": 0.5, "GPU": 1.0}  # configs/pure.yaml: 0.5 CPU per actor
    assert p.rank_strategy == "STRICT_PACK"  # 8 ranks fit one 8-GPU node
    assert p.layout == (("10.0.0.1", 8, 0),) + tuple((f"10.0.0.{i}", 0, 8) for i in range(2, 6))


def test_33_gpus_worth_on_32_gpus_is_refused_with_the_figures():
    t0 = time.monotonic()
    with pytest.raises(ResourceError) as e:
        plan(pure(25, 8), gpu_nodes(4))  # 25 + 8 = 33 GPUs on 4 × 8 = 32
    assert time.monotonic() - t0 < 1
    msg = str(e.value)
    assert "asked 8 learner rank(s) × [1 GPU + 1 CPU + ~1 GiB] packed" in msg
    assert "25 actor(s) × [1 GPU + 0.5 CPU + ~1.5 GiB] spread" in msg  # a GPU engine's KV cache is not host memory
    assert "nodes: 10.0.0.1: 96 CPU, 8 GPU, 1000.0 GiB; 10.0.0.2: 96 CPU, 8 GPU" in msg
    # ranks take node 1; nodes 2–4 hold 24 actors: 25 GPUs asked of the 24 left
    assert "room for the learner ranks but for only 24 of the 25 actors beside them (25 GPU needed, 24 free)" in msg
    assert "Fix: --actors 24 or add nodes to the cluster" in msg or "Fix: --actors 24 or join a larger" in msg


def test_an_actor_bundle_must_fit_on_one_node():
    # 1 GPU + 8 CPUs per actor; 3 nodes of 6 CPUs hold 18 CPUs in all, but no node holds 8
    nodes = gpu_nodes(3, cpus=6)
    with pytest.raises(ResourceError) as e:
        plan(pure(2, 1, "rollout.cpus_per_actor=8"), nodes, joined=True)
    msg = str(e.value)
    assert "only 0 of the 2 actors" in msg and "split across nodes" in msg
    # the rank takes 1 CPU of node 1 (5 left), nodes 2 and 3 keep 6: two actors of ≤ 6 CPUs fit
    assert "--set rollout.cpus_per_actor=6 or add nodes to the cluster" in msg
    plan(pure(2, 1, "rollout.cpus_per_actor=6"), nodes)


def opd_engine(actors: int, ranks: int, *overrides: str):
    """--algo opd whose teacher scores on its own engine: one teacher engine in the driver's process."""
    return resolve("opd", flags={"rollout.num_actors": actors, "learner.world_size": ranks},
                   overrides=["teacher.path=/models/teacher", "teacher.scoring=engine", *overrides])


def test_the_teacher_engine_takes_its_gpu_on_the_driver_node_first():
    # 2 nodes × 8 GPUs; the driver runs on node 2: the teacher's engine takes 1 of its GPUs (an actor engine's
    # bundle without its CPU). 4 ranks pack onto node 1 (room after: node 1 has 4 + node 2 has 7 = 11 actors;
    # on node 2 it would be 3 + 8 = 11 too: the first node wins the tie); the actors spread 4 + 7.
    p = plan(opd_engine(11, 4), gpu_nodes(2), joined=True, driver="10.0.0.2")
    assert (p.teachers, p.driver, p.teacher_bundle.ray_resources()) == (1, "10.0.0.2", {"GPU": 1.0})
    assert p.layout == (("10.0.0.1", 4, 4), ("10.0.0.2", 0, 7))
    assert "1 teacher engine(s) × [1 GPU + 0 CPU + ~1.5 GiB] on the driver's node 10.0.0.2" in p.summary()
    # 4 ranks + 12 actors + the teacher = 17 GPUs on 16: the teacher took the 16th
    with pytest.raises(ResourceError) as e:
        plan(opd_engine(12, 4), gpu_nodes(2), joined=True, driver="10.0.0.2")
    assert "(beside 1 teacher engine(s) × [1 GPU + 0 CPU + ~1.5 GiB] on the driver's node)" in str(e.value)
    assert "Fix: --actors 11 or add nodes" in str(e.value)
    # the same run with the teacher on the learner ranks (the default) holds 12 actors
    assert plan(opd_engine(12, 4, "teacher.scoring=learner"), gpu_nodes(2), joined=True).teachers == 0


def test_a_teacher_engine_needs_room_on_the_driver_node_itself():
    cpu_head = Node("10.0.0.9", 16, 0, 64)  # algo-train started on a CPU-only head node
    with pytest.raises(ResourceError) as e:
        plan(opd_engine(2, 1), [cpu_head, *gpu_nodes(1)], joined=True, driver="10.0.0.9")
    msg = str(e.value)
    assert "1 teacher engine(s) × [1 GPU + 0 CPU + ~1.5 GiB] run in the driver's process, on its node" in msg
    assert "(10.0.0.9: 16 CPU, 0 GPU, 64.0 GiB: 1 GPU needed, 0 free)" in msg
    assert "Fix: run algo-train on a node with 1 GPU(s) free for the teacher, or --set teacher.scoring=learner" in msg
    with pytest.raises(ResourceError, match=r"driver's node \(10.9.9.9\) is not among the cluster's nodes"):
        plan(opd_engine(2, 1), gpu_nodes(2), joined=True, driver="10.9.9.9")
    # LUFFY's live teacher on one CPU machine: its engine's memory (1 GiB of KV cache + 1.5) is counted there
    luffy = resolve("luffy", flags={"rollout.num_actors": 2}, overrides=["teacher.path=/t", "teacher.live_traces=missing"])
    p = plan(luffy, [Node("this machine", 2, 0, 16)])
    assert p.teachers == 1 and "[0 CPU + ~2.5 GiB] on this machine" in p.summary() and p.driver is None
    # 8 GiB: the teacher's 2.5 and the rank's 1 leave 4.5, which holds one actor (2.5), not two
    with pytest.raises(ResourceError, match=r"only 1 of the 2 actors beside them \(5 GiB of memory needed, 4.5 free\)"):
        plan(luffy, [Node("this machine", 2, 0, 8)])


def test_ranks_pack_over_nodes_when_one_cannot_hold_them_and_actors_spread():
    p = plan(pure(4, 12), gpu_nodes(3))
    assert p.rank_strategy == "PACK"
    assert [(r, a) for _, r, a in p.layout] == [(8, 0), (4, 2), (0, 2)]  # spread: the emptier node first
    # 16 GPUs hold 16 of 17 ranks; with the one actor beside them, 15 ranks is the most that fits
    with pytest.raises(ResourceError, match=r"room for only 16 of the 17 learner ranks .*--set learner.world_size=15"):
        plan(pure(1, 17), gpu_nodes(2))


def test_tensor_parallel_bundles_and_custom_resources():
    nodes = gpu_nodes(1) + [Node("10.0.0.9", 96, 8, 1000, {"accel_node": 8})]
    cfg = pure(2, 1, "rollout.engine.tensor_parallel_size=4", "rollout.custom_resources={accel_node: 1}")
    p = plan(cfg, nodes)
    assert p.actor_bundle.ray_resources() == {"CPU": 0.5, "GPU": 4.0, "accel_node": 1.0}  # auto = tp GPUs
    # only node 9 has accel_node: two 4-GPU engines fill its 8 GPUs, so the rank goes to node 1
    assert p.layout == (("10.0.0.1", 1, 0), ("10.0.0.9", 0, 2))
    with pytest.raises(ResourceError, match="only 2 of the 4 actors"):
        plan(pure(4, 1, "rollout.engine.tensor_parallel_size=4", "rollout.custom_resources={accel_node: 1}"), nodes)


def test_auto_resolves_against_the_cluster_and_is_recorded():
    cfg = resolve("grpo")
    assert (cfg.rollout.gpus_per_actor, cfg.learner.gpus_per_rank, cfg.model.dtype) == ("auto", "auto", "auto")
    on_gpus = ClusterInfo("10.0.0.1:6379", "--ray-address", tuple(gpu_nodes(2))).resolve(cfg)
    assert (on_gpus.rollout.gpus_per_actor, on_gpus.learner.gpus_per_rank, on_gpus.model.dtype) == (1.0, 1.0, "bfloat16")
    assert on_gpus.ray_address == "10.0.0.1:6379"
    on_cpu = ClusterInfo(None, "this machine", (Node("this machine", 2, 0, 24),)).resolve(cfg)
    assert (on_cpu.rollout.gpus_per_actor, on_cpu.learner.gpus_per_rank, on_cpu.model.dtype) == (0.0, 0.0, "float32")
    assert on_cpu.ray_address is None
    assert (on_gpus.weight_sync.backend, on_cpu.weight_sync.backend) == ("nccl", "gloo")  # auto: GPUs on both ends
    assert ClusterInfo(None, "a local Ray", (Node("this machine", 2, 0, 24),)).describe() == \
        "this machine (a local Ray): 2 CPU, 0 GPU, 24.0 GiB"
    assert ClusterInfo("10.0.0.1:6379", "RAY_ADDRESS", tuple(gpu_nodes(2))).describe() == \
        ("Ray cluster at 10.0.0.1:6379 (RAY_ADDRESS): 10.0.0.1: 96 CPU, 8 GPU, 1000.0 GiB; "
         "10.0.0.2: 96 CPU, 8 GPU, 1000.0 GiB")
    from configs.loading import dump_annotated

    assert "gpus_per_actor: 0.0" in dump_annotated(on_cpu) and "dtype: float32" in dump_annotated(on_cpu)
    tp = resolve_auto(resolve("grpo", overrides=["rollout.engine.tensor_parallel_size=2"]), gpu_nodes(1))
    assert tp.rollout.gpus_per_actor == 2.0


def test_zero_gpus_on_a_gpu_cluster_and_tensor_parallel_without_gpus_are_refused():
    with pytest.raises(ResourceError) as e:
        resolve_auto(resolve("grpo", overrides=["rollout.gpus_per_actor=0", "learner.gpus_per_rank=0"]),
                     gpu_nodes(1))
    msg = str(e.value)
    assert "rollout.gpus_per_actor=0 on a cluster with 8 GPUs: every vLLM engine would open GPU 0 — use " \
           "--set rollout.gpus_per_actor=auto (1 per actor)" in msg
    assert "learner.gpus_per_rank=0 on a cluster with 8 GPUs" in msg and "learner.gpus_per_rank=auto" in msg
    resolve_auto(resolve("sft", overrides=["rollout.gpus_per_actor=0"]), gpu_nodes(1))  # SFT starts no actor
    with pytest.raises(ResourceError, match="tensor_parallel_size=2 shards each engine over GPUs but there are none"):
        resolve_auto(resolve("grpo", overrides=["rollout.engine.tensor_parallel_size=2"]), [Node("m", 8, 0, 32)])
    with pytest.raises(ResourceError, match="weight_sync.backend=nccl needs GPUs on the learner ranks and on the "
                                            r"actors \(learner.gpus_per_rank=0, rollout.gpus_per_actor=0\) — use "
                                            "--set weight_sync.backend=gloo"):
        resolve_auto(resolve("grpo", overrides=["weight_sync.backend=nccl"]), [Node("m", 8, 0, 32)])


@pytest.mark.parametrize("overrides,message", [
    (["rollout.gpus_per_actor=1", "rollout.engine.tensor_parallel_size=2"],
     "rollout.gpus_per_actor: 1 GPU(s) per actor but rollout.engine.tensor_parallel_size=2"),
    (["rollout.gpus_per_actor=2"], "or rollout.engine.tensor_parallel_size=2"),
    (["rollout.gpus_per_actor=0.5"], "rollout.engine.gpu_memory_utilization: engines share GPUs"),
    (["rollout.gpus_per_actor=0.5", "rollout.engine.gpu_memory_utilization=0.9"], "use at most 0.5"),
    (["rollout.gpus_per_actor=lots"], "rollout.gpus_per_actor: expects 'auto' or a number ≥ 0, got 'lots'"),
])
def test_gpu_settings_that_cannot_work_fail_at_parse_time(overrides, message):
    with pytest.raises(ConfigError) as e:
        resolve("grpo", overrides=overrides)
    assert message in str(e.value)


def test_finding_the_ray_to_join(tmp_path):
    env = {"RAY_TMPDIR": str(tmp_path)}
    assert find_cluster(None, env) == (None, "this machine")
    assert find_cluster("10.0.0.1:6379", {**env, "RAY_ADDRESS": "x:1"}) == ("10.0.0.1:6379", "--ray-address")
    assert find_cluster(None, {**env, "RAY_ADDRESS": "10.0.0.2:6379"}) == ("10.0.0.2:6379", "RAY_ADDRESS")
    assert find_cluster(None, {**env, "RAY_ADDRESS": ""}) == (None, "this machine")
    with pytest.raises(ResourceError, match="--ray-address auto: no Ray cluster found"):
        find_cluster("auto", env)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("192.0.2.7:6379\n")  # what `ray start --head` writes
    address, source = find_cluster("auto", env)
    assert address == "192.0.2.7:6379" and "local `ray start` cluster" in source
    assert find_cluster(None, env)[0] == "192.0.2.7:6379"


def test_joining_a_dead_cluster_fails_in_seconds_with_the_fix(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(ResourceError) as e:
        ClusterInfo.discover(None, environ={"RAY_TMPDIR": str(tmp_path)})
    assert time.monotonic() - t0 < 10
    assert f"cannot join the Ray cluster at 127.0.0.1:{port} (from the local `ray start` cluster" in str(e.value)
    assert "nothing answers" in str(e.value) and "`ray stop` removes" in str(e.value)
    assert probe("10.0.0.1") == "'10.0.0.1' is not HOST:PORT" and probe("ray://head:10001") is None


def test_nodes_from_ray_reads_per_node_capacity():
    dead = {"Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 8.0}}
    live = {"Alive": True, "NodeManagerAddress": "10.0.0.2",
            "Resources": {"CPU": 16.0, "GPU": 8.0, "memory": 64 * 2**30, "object_store_memory": 1e9,
                          "node:10.0.0.2": 1.0, "node:__internal_head__": 1.0, "accel_node": 8.0}}
    cpu_only = {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0, "memory": 2**33}}
    assert nodes_from_ray([dead, live, cpu_only]) == [Node("10.0.0.1", 4.0, 0.0, 8.0, {}),
                                                      Node("10.0.0.2", 16.0, 8.0, 64.0, {"accel_node": 8.0})]


def test_engine_settings_reach_vllm_engine_args(tmp_path):
    from vllm.engine.arg_utils import AsyncEngineArgs

    cfg = resolve_auto(resolve("grpo", overrides=[
        "rollout.engine.tensor_parallel_size=2", "rollout.engine.max_num_seqs=64",
        "rollout.engine.enable_prefix_caching=true", "rollout.kv_cache_gib=6"]), gpu_nodes(1))
    kw = EngineSpec.from_config(cfg, tmp_path, weight_transfer=False).engine_args_kwargs()
    assert kw["dtype"] == "bfloat16" and kw["tensor_parallel_size"] == 2 and kw["distributed_executor_backend"] == "mp"
    assert kw["kv_cache_memory_bytes"] == 6 * 2**30 and "gpu_memory_utilization" not in kw
    assert kw["max_num_seqs"] == 64 and kw["enable_prefix_caching"] is True and kw["enforce_eager"] is False
    assert "enable_chunked_prefill" not in kw  # the CPU-only workaround stays on CPU
    AsyncEngineArgs(**kw)  # every key is a real engine argument of the installed vLLM
    util = resolve_auto(resolve("grpo", overrides=["rollout.engine.gpu_memory_utilization=0.6"]), gpu_nodes(1))
    kw = EngineSpec.from_config(util, tmp_path, weight_transfer=False).engine_args_kwargs()
    assert kw["gpu_memory_utilization"] == 0.6 and "kv_cache_memory_bytes" not in kw
    cpu = EngineSpec.from_config(resolve_auto(resolve("grpo"), [Node("m", 2, 0, 24)]), tmp_path, weight_transfer=False)
    kw = cpu.engine_args_kwargs()
    assert kw["dtype"] == "float32" and kw["enforce_eager"] is True and "tensor_parallel_size" not in kw


def test_a_teacher_engine_starts_seeing_only_the_gpus_held_for_it(tmp_path, monkeypatch):
    """The teacher's engine runs in the driver's process, which sees every GPU: its processes (spawned while the
    engine is built) get the lease's CUDA_VISIBLE_DEVICES, and the driver's own value is back afterwards."""
    from actors.engine import visible_devices

    spec = EngineSpec.from_config(opd_engine(1, 1), tmp_path, weight_transfer=False, devices="5,6")
    assert spec.devices == "5,6" and "devices" not in spec.engine_args_kwargs()  # not a vLLM argument
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    with visible_devices(spec.devices):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(RuntimeError), visible_devices("3"):
        raise RuntimeError("the engine failed to start")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # unset again, even after a failed start
    with visible_devices(None):  # an actor's engine (Ray set its devices) or a CPU teacher: left alone
        assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.slow
def test_placement_groups_on_a_real_ray_with_declared_gpus():
    """Ray lets a CPU machine declare GPUs: the plan, the reservation and a role in its bundle are real;
    a group Ray accepts but cannot place fails at the deadline with the figures instead of hanging."""
    import ray

    from launch.planning.cluster import cluster_nodes
    from launch.planning.placement import Placement

    ray.init(address="local", num_cpus=2, num_gpus=8, resources={"accel_node": 2}, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    try:
        (node,) = cluster_nodes()
        assert (node.cpus, node.gpus, node.custom) == (2.0, 8.0, {"accel_node": 2.0})
        p = plan(pure(2, 1, "rollout.custom_resources={accel_node: 1}"), [node])
        placement = Placement(p, timeout_s=30)
        placement.reserve()

        @ray.remote
        def gpu_ids():
            return ray.get_gpu_ids()

        in_bundle = gpu_ids.options(num_cpus=0.5, num_gpus=1, resources={"accel_node": 1},
                                    scheduling_strategy=placement.strategy("actors", 1))
        assert len(ray.get(in_bundle.remote(), timeout=60)) == 1  # the actor's bundle holds one GPU
        assert placement.teacher_devices() == []  # no teacher engine
        placement.remove()
        # a teacher engine (in this, the driver's, process) gets a GPU of its own: held by a lease, not an actor's
        with_teacher = Placement(plan(opd_engine(2, 1), [node]), timeout_s=30)
        with_teacher.reserve()
        (devices,) = with_teacher.teacher_devices()
        actors_gpus = ray.get([gpu_ids.options(num_cpus=0.5, num_gpus=1,
                                               scheduling_strategy=with_teacher.strategy("actors", i)).remote()
                               for i in range(2)], timeout=60)
        assert devices.isdigit() and int(devices) not in {g for ids in actors_gpus for g in ids}
        with_teacher.remove()
        # the check believed in a 4-CPU node; Ray has 2 CPUs: accepted, never placed
        bigger = plan(pure(4, 1, "rollout.cpus_per_actor=0.75"), [Node(node.name, 4, 8, node.memory_gib)])
        stuck = Placement(bigger, timeout_s=2)
        t0 = time.monotonic()
        with pytest.raises(ResourceError) as e:
            stuck.reserve()
        assert time.monotonic() - t0 < 10 and stuck.groups == {}
        msg = str(e.value)
        # the learner's group (1 CPU) may also still be pending after 2 s on a loaded machine
        assert re.search(r"could not place (the learner and )?the actors within 2 s \(placement_timeout_s\)", msg), msg
        assert "4 actor(s) × [1 GPU + 0.75 CPU + ~1.5 GiB] SPREAD" in msg and "2 CPU, 8 GPU" in msg
    finally:
        ray.shutdown()


def test_engines_sharing_a_gpu_push_over_gloo_and_nccl_there_is_refused_before_start():
    """A2: NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", NCCL
    init.cc), so engines at a fraction of a GPU cannot join an NCCL weight-sync group."""
    from launch.planning.resources import sharing_note

    share = ["rollout.gpus_per_actor=0.25", "rollout.engine.gpu_memory_utilization=0.2"]
    cfg = resolve_auto(resolve("grpo", overrides=share), gpu_nodes(1))  # auto -> gloo, and says so
    assert cfg.weight_sync.backend == "gloo"
    assert "weight sync over gloo" in sharing_note(cfg) and "NCCL refuses two ranks on one GPU" in sharing_note(cfg)
    assert plan(resolve("grpo", overrides=share + ["rollout.num_actors=28"]), gpu_nodes(1)).actors == 28  # 7 GPUs
    whole = resolve_auto(resolve("grpo"), gpu_nodes(1))
    assert whole.weight_sync.backend == "nccl" and sharing_note(whole) is None
    with pytest.raises(ResourceError) as e:
        plan(resolve("grpo", overrides=share + ["weight_sync.backend=nccl"]), gpu_nodes(1))
    assert ("weight_sync.backend=nccl with rollout.gpus_per_actor=0.25: engines share GPUs and NCCL refuses two "
            "ranks of its group on one GPU (\"Duplicate GPU detected\") — use --set weight_sync.backend=gloo (or "
            "auto), or whole GPUs per actor: --set rollout.gpus_per_actor=auto (1 per actor)") in str(e.value)
    with pytest.raises(ResourceError, match=r"learner.gpus_per_rank=0.5 with learner.world_size=2: ranks would "
                                            r"share a GPU .* — use --set learner.gpus_per_rank=auto"):
        resolve_auto(resolve("grpo", overrides=["learner.gpus_per_rank=0.5", "learner.world_size=2"]), gpu_nodes(1))
    resolve_auto(resolve("grpo", overrides=["learner.gpus_per_rank=0.5"]), gpu_nodes(1))  # one rank: no group


def test_gpu_engines_size_their_kv_cache_by_memory_share_unless_kv_cache_gib_is_set(tmp_path):
    """A4: 1 GiB of KV (≈ 18.7k tokens of Qwen2.5-7B) was every GPU engine's default; now vLLM fills
    gpu_memory_utilization 0.85 of the GPU, and rollout.kv_cache_gib applies on GPUs only when set."""
    gpu = resolve_auto(resolve("grpo"), gpu_nodes(1))
    assert gpu.rollout.kv_cache_gib is None and gpu.rollout.engine.gpu_memory_utilization == 0.85  # recorded
    kw = EngineSpec.from_config(gpu, tmp_path, weight_transfer=False).engine_args_kwargs()
    assert kw["gpu_memory_utilization"] == 0.85 and "kv_cache_memory_bytes" not in kw
    unresolved = EngineSpec(str(tmp_path), cpu=False, weight_transfer=False).engine_args_kwargs()
    assert unresolved["gpu_memory_utilization"] == 0.85 and "kv_cache_memory_bytes" not in unresolved
    both = resolve_auto(resolve("grpo", overrides=["rollout.kv_cache_gib=20", "rollout.engine.gpu_memory_utilization=0.5"]),
                        gpu_nodes(1))
    kw = EngineSpec.from_config(both, tmp_path, weight_transfer=False).engine_args_kwargs()
    assert kw["kv_cache_memory_bytes"] == 20 * 2**30 and kw["gpu_memory_utilization"] == 0.5
    cpu = resolve_auto(resolve("grpo"), [Node("m", 2, 0, 24)])
    assert cpu.rollout.kv_cache_gib == 1.0 and cpu.rollout.engine.gpu_memory_utilization is None  # as before
    spec = EngineSpec.from_config(resolve("grpo"), tmp_path, weight_transfer=False, cpu=True)
    assert "gpu_memory_utilization" not in spec.engine_args_kwargs()
    assert plan(resolve("grpo"), [Node("m", 2, 0, 24)]).actor_bundle.memory_gib == 2.5  # 1 GiB KV + 1.5


def test_an_engine_reports_the_kv_tokens_vllm_allocated():
    """A4: the start-up line reads vLLM 0.32's figure (cache_config.num_gpu_blocks × block_size)."""
    from types import SimpleNamespace

    from actors.engine import kv_cache_line, kv_cache_tokens

    engine = SimpleNamespace(vllm_config=SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=1170,
                                                                                      block_size=16)))
    assert kv_cache_tokens(engine) == 18720
    line = kv_cache_line(engine, EngineSpec("m", cpu=False, max_model_len=4096, kv_cache_gib=1.0))
    assert line == ("[engine] KV cache: 18,720 tokens (rollout.kv_cache_gib=1 per GPU) = 4.6 sequences of "
                    "max_model_len 4,096")
    gpu_line = kv_cache_line(engine, EngineSpec("m", cpu=False, max_model_len=4096))
    assert "(gpu_memory_utilization=0.85)" in gpu_line
    assert "did not report" in kv_cache_line(SimpleNamespace(), EngineSpec("m"))


def test_learner_memory_defaults_are_per_device_and_cpu_keeps_its_old_values():
    """C7: a 4096-token chunk of a 152k vocabulary is 2.5 GB of fp32 logits per buffer; GPU learners get
    1024-token chunks and 16k-token micro-batches, CPU keeps 4096 and the row cap only."""
    gpu = resolve_auto(resolve("grpo"), gpu_nodes(1))
    assert (gpu.learner.logprob_chunk_tokens, gpu.learner.micro_batch_tokens) == (1024, 16384)
    cpu = resolve_auto(resolve("grpo"), [Node("m", 2, 0, 24)])
    assert (cpu.learner.logprob_chunk_tokens, cpu.learner.micro_batch_tokens) == (4096, None)
    mine = resolve_auto(resolve("grpo", overrides=["learner.logprob_chunk_tokens=2048",
                                                   "learner.micro_batch_tokens=null"]), gpu_nodes(1))
    assert (mine.learner.logprob_chunk_tokens, mine.learner.micro_batch_tokens) == (2048, None)


def test_prompts_in_flight_auto_is_todays_16_on_cpu_and_left_to_the_engines_on_gpus():
    user = resolve("grpo", flags={"model.path": "/models/q"})  # a user's model: prompts_in_flight auto
    assert resolve_auto(user, [Node("m", 2, 0, 24)]).rollout.prompts_in_flight == 16  # config.yaml records it
    assert resolve_auto(user, gpu_nodes(1)).rollout.prompts_in_flight == "auto"  # each actor sizes it at start


def test_the_plan_warns_when_the_credit_leaves_gpu_engines_mostly_idle(tmp_path):
    """The docs' 7B recipe as it stood (PURE: batch 16, n 4) on 8 H100 engines. Ray names each node's GPU type
    (`accelerator_type:H100`); the estimate takes the smallest H100, 79 GiB (launch.planning.engine_load)."""
    import json

    model = tmp_path / "q7b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(dict(
        num_hidden_layers=28, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        intermediate_size=18944, max_position_embeddings=4096, tie_word_embeddings=False)))
    h100 = [Node("10.0.0.1", 96, 8, 1000, {"learner_node": 8, "accelerator_type:H100": 1}),
            Node("10.0.0.2", 96, 8, 1000, {"actor_node": 8, "accelerator_type:H100": 1})]
    pin = ["rollout.custom_resources={actor_node: 1}", "learner.custom_resources={learner_node: 1}"]

    def planned(*overrides, nodes=h100):
        p = plan(resolve("pure", flags={"model.path": str(model), "rollout.num_actors": 8, "learner.world_size": 8},
                         overrides=[*pin, *overrides]), nodes, joined=True)
        return SimpleNamespace(notes=tuple(n for n in p.notes if "can feed" not in n))  # tests/launch/test_feed_rate.py

    (note,) = planned().notes
    # (0.85 × 79 GiB − 7,615,487,488 × 2 B − 4 GiB) / 57,344 B = 916,849 tokens = 223 sequences of 4,096;
    # W = (4 + 1) × 16 = 80 groups over 8 actors: 10 prompts × 4 = 40 sequences, 18 % of 223
    assert note.startswith("[plan] engines mostly idle: each engine keeps at most 10 prompts × 4 = 40 sequences in "
                           "flight, 18% of the 223 it holds")
    assert "— raise learner.batch_prompts to 45 or run 2 actors (--actors 2)" in note
    assert note.endswith("; estimated 916,849 KV tokens per engine (0.85 of a 79 GiB H100 − weights − 4 GiB; each "
                         "engine prints its own at start)")
    assert planned("learner.batch_prompts=64", "rollout.n=8").notes == ()  # the PURE paper's 64 × 8: 27 × 8 of 223
    # no GPU type known (nodes declared by `ray start` flags alone): nothing estimated, nothing said
    assert planned(nodes=[Node(n.name, 96, 8, 1000, {k: v for k, v in n.custom.items() if "accel" not in k})
                          for n in h100]).notes == ()
    # a KV cache the user sized needs no GPU type: 20 GiB / 57,344 B = 374,491 tokens = 91 sequences
    (note,) = planned("rollout.kv_cache_gib=20", nodes=[Node(n.name, 96, 8, 1000, {k: v for k, v in n.custom.items()
                                                                                  if "accel" not in k}) for n in h100]).notes
    assert "of the 91 it holds" in note and "374,491 KV tokens per engine (rollout.kv_cache_gib=20 per GPU" in note
    assert plan(pure(8, 8), h100).notes == ()  # the built-in tiny model: no shape to estimate from
