"""`ActorRole`: a rollout actor as the orchestrator places it. It *is* `actors.actor.RolloutActor` (every
method the driver calls is the actor's own), plus what its process needs before the engine starts and
the two answers `launch.processes.process_graph.ProcessGraph` asks of every role (`start` returns the pid, `where`).

`launch.processes.process_graph` wraps it with `ray.remote` (Ray names its processes `ray::ActorRole`), or with
`--serial` calls it in the driver's process; either way the process environment of `actor_env` is set
before it starts (Ray's runtime_env, or the driver's own environment), which its vLLM engine processes
inherit.
"""

from __future__ import annotations

import os

from actors.actor import RolloutActor
from launch.planning.cluster import joins_cluster
from launch.processes.roles import node_host, to_log_file, where


def actor_env(cfg) -> dict[str, str]:
    """The environment of an actor's process: its engine's KV cache (`VLLM_CPU_KVCACHE_SPACE`, GiB).
    Engines log at ERROR unless the user asks for more (their INFO lines would bury the
    progress line: vLLM logs every weight reload); c10d's polling chatter is silenced the same way.
    (No `VLLM_CPU_OMP_THREADS_BIND`: only vLLM's multiprocess executor applies it, and CPU engines run
    the in-process one, `actors.engine`; the engine's threads are the process's torch threads, which
    Ray sets from the actor's CPUs.)"""
    return {"VLLM_CPU_KVCACHE_SPACE": str(max(1, int(cfg.rollout.resolved_kv_cache_gib(gpu=False)))),
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
            "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}


class ActorRole(RolloutActor):
    """One rollout actor (`actors.actor.RolloutActor`), its output in its log file (`launch.processes.roles.to_log_file`)."""

    def __init__(self, cfg, actor_id: int, model_dir: str, buffer_address: str, prompts,
                 initial_version: int = 0, skip: list | None = None, secrets=None, num_actors: int | None = None):
        """skip: (epoch, prompt) pairs never to generate (trained, discarded or held by the buffer:
        `launch.state.ledger`); secrets: the run's client credentials for the buffer (`RunSecrets.public()`);
        num_actors: how many shards the prompts are cut into (None: `rollout.num_actors`; a rescaled run's
        own count otherwise)."""
        to_log_file()
        if joins_cluster(cfg):  # the engine's own processes talk over this node's address
            os.environ.setdefault("VLLM_HOST_IP", node_host(cluster=True))
        super().__init__(cfg, actor_id=actor_id, model_dir=model_dir, buffer_address=buffer_address,
                         prompts=prompts, initial_version=initial_version, secrets=secrets, num_actors=num_actors)
        self._prompts, self._seed = prompts, cfg.seed  # every prompt: a rescaled run cuts new shards
        if skip:
            self.core.cursor.skip(skip)

    def set_demos(self, demos: dict) -> None:
        """`RolloutActor.set_demos`, kept for a later reshard too."""
        from actors.prompts import with_demos

        self._prompts = with_demos(self._prompts, demos)
        super().set_demos(demos)

    def reshard(self, num_actors: int, skip: list) -> None:
        """Take shard `actor_id::num_actors` of the prompts, walking it from the top past `skip` (every
        prompt the ledger and the buffer account for): the run's actor count changed
        (`launch.state.scaling`). Only between rollouts (after `stop`): nothing of the old shard is in
        flight then. The engine's concurrency is sized again for the new count when rollouts restart."""
        from actors.prompts import PromptCursor, shard

        async def swap():
            core = self.core
            if core._run_task is not None and not core._run_task.done():
                raise RuntimeError(f"{core.name}: reshard() while its rollouts run (stop them first)")
            core.num_actors, core.load = num_actors, None
            core.cursor = PromptCursor(shard(self._prompts, core.actor_id, num_actors), seed=self._seed,
                                       actor_id=core.actor_id)
            core.cursor.skip(skip)

        self._call(swap())

    def start(self) -> int:
        """Start the engine and the group delivery (`RolloutActor.start`); returns this process's id."""
        super().start()
        return os.getpid()

    def gpu(self) -> tuple[str, tuple[str, ...]]:
        """(node id, GPU ids) Ray gave this actor: actors with the same pair share a GPU, and their engines
        start one after another (`launch.processes.joining`)."""
        import ray

        return ray.get_runtime_context().get_node_id(), tuple(str(g) for g in ray.get_gpu_ids())

    def where(self) -> dict:
        return where()
