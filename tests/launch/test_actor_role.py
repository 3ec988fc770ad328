"""`ActorRole` is `actors.RolloutActor` as Ray places it (no forwarding layer in between): every call
`launch.processes.process_graph.ProcessGraph` makes on an actor is a method of the Ray-wrapped class, taking the
arguments the graph passes; it builds in-process as `--serial` builds it; and `actor_env` is the one
place the actor's process environment comes from. No Ray is started and no engine is built."""

from __future__ import annotations

import inspect
import os
import socket

import ray

from configs.loading import resolve
from launch.processes.actor_role import ActorRole, actor_env

# name -> the positional arguments `ProcessGraph` passes (launch/processes/process_graph.py)
GRAPH_CALLS = {"start": (), "connect_weight_sync": ("10.0.0.1", 1234, "token"), "follow_weight_updates": (),
               "start_rollouts": (), "stop": (True, 30.0), "evaluate": ([],), "stats": (), "where": (),
               "delivered_since": (0.0,), "requeue": ([[0, 1]],), "close": (), "gpu": ()}


def test_ray_sees_every_method_the_graph_calls_with_the_graph_s_arguments():
    methods = ray.remote(ActorRole).__ray_metadata__.method_meta.methods  # what `ray.remote` exposes
    for name, args in GRAPH_CALLS.items():
        assert name in methods, name
        inspect.signature(getattr(ActorRole, name)).bind(None, *args)
    inspect.signature(ActorRole).bind(resolve("grpo"), 0, "/model", "tcp://127.0.0.1:1", [], 3, [[0, 1]], None)


def test_the_actor_env_sizes_the_kv_cache_and_keeps_the_user_s_log_level(monkeypatch):
    cfg = resolve("grpo", overrides=["rollout.kv_cache_gib=2.5"])
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    assert actor_env(cfg) == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_LOGGING_LEVEL": "DEBUG",
                              "TORCH_CPP_LOG_LEVEL": "ERROR"}


def test_an_actor_role_builds_in_process_as_serial_builds_it(tmp_path):
    """The graph's constructor arguments, a tiny model, no engine (`start` is what builds one)."""
    from actors.prompts import items_from_records, load_tokenizer
    from tasks.arithmetic import sample_problems
    from tasks.demos import demonstration_records
    from tasks.tiny_model import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny"))
    records = demonstration_records(sample_problems(4, split="train", seed=0), error_rate=0.0, seed=0)
    prompts, _ = items_from_records(records, load_tokenizer(model), 48)
    role = ActorRole(resolve("grpo"), 0, model, "tcp://127.0.0.1:1", prompts, 3, [[0, 1]], None)
    try:
        assert role.version == 3 and role.stats()["actor_id"] == 0
        assert role.where() == {"pid": os.getpid(), "host": socket.gethostname()}
    finally:
        role.close()
