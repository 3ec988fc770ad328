"""`ProcessGraph`: the roles of a run (learner ranks, rollout actors) placed as Ray actors — or, with
`--serial`, as plain objects in this process — behind one set of methods the driver calls.

Ray is started here (a local cluster by default, `--ray-address` to join one); each role gets explicit
resources (CPU shares, GPUs) from the config. A dead actor is detected by the health check the driver
runs every step; `restart_actor` replaces it, rebuilds the weight-sync group (a failed group cannot be
reused) and pushes the current weights, and its unfinished prompts are regenerated (the ledger skips
only prompts already trained or held by the buffer).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import algos
from configs.schema import RunConfig
from launch.data import RunData
from launch.ledger import Key
from launch.roles import ActorRole, LearnerRank


class _Local:
    """A role object in this process, called like a Ray handle (`h.m.remote(...)` -> result)."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        method = getattr(self._obj, name)

        class _M:
            @staticmethod
            def remote(*args, **kwargs):
                return method(*args, **kwargs)

        return _M


class ProcessGraph:
    def __init__(self, cfg: RunConfig, model_dir: Path, buffer_address: str, data: RunData, log=print):
        self.cfg, self.model_dir, self.buffer_address, self.data, self.log = cfg, model_dir, buffer_address, data, log
        self.serial = cfg.serial
        self.ranks: list = []
        self.actors: list = []
        self.actor_cores: list = []
        self.restarts = 0
        if not self.serial:
            import ray

            if not ray.is_initialized():
                kwargs = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": True}
                if cfg.ray_address:
                    ray.init(address=cfg.ray_address, **kwargs)
                else:
                    ray.init(num_cpus=max(1, len(os.sched_getaffinity(0))), **kwargs)
            self._ray = ray

    # ------------------------------------------------------------------ helpers
    def _get(self, futures, timeout: float | None = None):
        if self.serial:
            return futures
        return self._ray.get(futures, timeout=timeout)

    def _make(self, cls, *, num_cpus: float, num_gpus: float, max_concurrency: int, env: dict | None = None):
        if self.serial:
            return lambda *a, **k: _Local(cls(*a, **k))
        opts = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_concurrency": max_concurrency, "max_restarts": 0}
        if env:
            opts["runtime_env"] = {"env_vars": env}
        return self._ray.remote(cls).options(**opts).remote

    # ------------------------------------------------------------------ learner
    def start_learner(self, rank_cores: list) -> None:
        from learner.distributed import free_port

        lc, w = self.cfg.learner, self.cfg.learner.world_size
        init_method = f"tcp://127.0.0.1:{free_port()}" if w > 1 else None
        make = self._make(LearnerRank, num_cpus=lc.cpus_per_rank, num_gpus=lc.gpus_per_rank, max_concurrency=2)
        receivers = 0 if algos.get(self.cfg.algo).trains_on_demonstrations_only else self.cfg.rollout.num_actors
        self.ranks = [make(self.cfg, r, w, str(self.model_dir), init_method, rank_cores[r], receivers)
                      for r in range(w)]

    def step(self, groups, version: int) -> dict:
        return self._get([r.step.remote(groups, version) for r in self.ranks])[0]

    def push_weights(self, version: int) -> dict:
        return self._get([r.push_weights.remote(version) for r in self.ranks])[0]

    def save(self, path: Path, extra_state: dict) -> None:
        self._get([r.save.remote(str(path), extra_state) for r in self.ranks])

    def load(self, path: Path) -> dict:
        return self._get([r.load.remote(str(path)) for r in self.ranks])[0]

    # ------------------------------------------------------------------ actors
    def _actor_env(self, cores) -> dict:
        # Engines log at ERROR unless the user asks for more (their INFO lines would bury the progress
        # line: vLLM logs every weight reload); c10d's polling chatter is silenced the same way.
        env = {"VLLM_CPU_KVCACHE_SPACE": str(max(1, int(self.cfg.rollout.kv_cache_gib))),
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
               "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
        if cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
        return env

    def _new_actor(self, i: int, skip: list[Key], version: int):
        r = self.cfg.rollout
        make = self._make(ActorRole, num_cpus=r.cpus_per_actor, num_gpus=r.gpus_per_actor, max_concurrency=4,
                          env=self._actor_env(self.actor_cores[i]))
        return make(self.cfg, i, str(self.model_dir), self.buffer_address, self.data.train, self.actor_cores[i],
                    version, [list(k) for k in skip])

    def start_actors(self, actor_cores: list, skip: list[Key], version: int = 0) -> None:
        if algos.get(self.cfg.algo).trains_on_demonstrations_only:
            return
        self.actor_cores = actor_cores
        t0 = time.monotonic()
        self.actors = [self._new_actor(i, skip, version) for i in range(self.cfg.rollout.num_actors)]
        self._get([a.start.remote() for a in self.actors])
        self.log(f"[graph] {len(self.actors)} vLLM actor(s) up in {time.monotonic() - t0:.0f}s")

    def connect_weight_sync(self) -> None:
        """Every actor joins rank 0's weight-sync group and follows its pushes."""
        if not self.actors:
            return
        host, port = self._get(self.ranks[0].reset_sender.remote(len(self.actors)))
        if self.serial:  # the sender waits for every receiver: join them from their own loop threads
            import threading

            threads = [threading.Thread(target=a.connect_weight_sync.remote, args=(host, port)) for a in self.actors]
            for t in threads:
                t.start()
            self.ranks[0].connect_sender.remote()
            for t in threads:
                t.join()
        else:
            self._get([a.connect_weight_sync.remote(host, port) for a in self.actors]
                      + [self.ranks[0].connect_sender.remote()])
        self._get([a.follow_weight_updates.remote() for a in self.actors])

    def start_rollouts(self) -> None:
        self._get([a.start_rollouts.remote() for a in self.actors])

    def actor_stats(self, timeout_s: float = 30.0) -> tuple[list[dict], list[int]]:
        """(stats of live actors, ids of dead ones)."""
        if self.serial:
            return [a.stats.remote() for a in self.actors], []
        stats, dead = [], []
        for i, a in enumerate(self.actors):
            try:
                stats.append(self._ray.get(a.stats.remote(), timeout=timeout_s))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
                dead.append(i)
        return stats, dead

    def restart_actor(self, i: int, skip: list[Key], version: int) -> None:
        self.log(f"[graph] actor {i} died; restarting it and re-syncing weights at version {version}")
        self._ray.kill(self.actors[i], no_restart=True)
        self.actors[i] = self._new_actor(i, skip, version)
        self._get(self.actors[i].start.remote())
        self.restarts += 1

    def evaluate(self, items) -> dict:
        return self._get(self.actors[0].evaluate.remote(items))

    def stop_actors(self, drain: bool, timeout_s: float) -> None:
        self._get([a.stop.remote(drain, timeout_s) for a in self.actors])

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                self._get(a.close.remote(), timeout=60) if not self.serial else a.close.remote()
            except Exception as e:  # noqa: BLE001 - shutting down: report and go on
                self.log(f"[graph] closing an actor failed: {e}")
        for r in self.ranks:
            try:
                self._get(r.close.remote(), timeout=30) if not self.serial else r.close.remote()
            except Exception as e:  # noqa: BLE001
                self.log(f"[graph] closing a learner rank failed: {e}")
        if not self.serial and self._ray.is_initialized():
            self._ray.shutdown()
