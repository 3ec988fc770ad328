"""The two process roles the orchestrator places with Ray: a learner rank and a rollout actor.

Both are plain classes (Ray-free, so `--serial` uses them directly); `launch.graph` wraps them with
`ray.remote` and the resources of the config. CPU placement: on a CPU machine each role is pinned to
the cores `launch.placement` chose for it (`VLLM_CPU_OMP_THREADS_BIND` for engines, sched_setaffinity +
torch threads for learner ranks), so actors and learner do not fight over the same cores.
"""

from __future__ import annotations

import os
from pathlib import Path


def pin_to_cores(cores: list[int] | None) -> None:
    """Restrict this process (and torch's intra-op pool) to `cores` (no-op when None)."""
    if not cores:
        return
    import torch

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(len(cores))


class LearnerRank:
    """One FSDP rank (`learner.Learner`); rank 0 also owns the weight-sync sender."""

    def __init__(self, cfg, rank: int, world_size: int, model_dir: str, init_method: str,
                 cores: list[int] | None = None, num_receivers: int = 0):
        pin_to_cores(cores)
        import transformers

        transformers.utils.logging.disable_progress_bar()  # its weight-loading bar would clobber the progress line
        from learner.learner import Learner

        self.cfg, self.rank = cfg, rank
        self.learner = Learner(cfg, rank=rank, world_size=world_size, model_dir=model_dir, init_method=init_method)
        self.sender = None
        if rank == 0 and num_receivers:
            self.reset_sender(num_receivers)

    def reset_sender(self, num_receivers: int) -> tuple[str, int]:
        """(Re)create the weight-sync group for `num_receivers` actors; returns its address."""
        from weightsync.sender import WeightSender

        if self.sender is not None:
            self.sender.close()
        ws = self.cfg.weight_sync
        host = "127.0.0.1"
        if self.cfg.ray_address is not None:  # actors may sit on other nodes
            import ray

            host = ray.util.get_node_ip_address()
        self.sender = WeightSender(num_receivers, host=host, port=0, bucket_mb=ws.bucket_mb, timeout_s=ws.deadline_s)
        return self.sender.address

    def connect_sender(self) -> None:
        if self.sender is not None:
            self.sender.connect()

    def step(self, groups, version: int) -> dict:
        return self.learner.step(groups, version)

    def push_weights(self, version: int) -> dict:
        """Every rank must call this (the full weights are gathered collectively)."""
        from weightsync.sender import drain

        weights = self.learner.named_full_weights()
        if self.sender is None:
            drain(weights)
            return {}
        return self.sender.push(weights, version)

    def save(self, path: str, extra_state: dict) -> str:
        return str(self.learner.save(Path(path), extra_state))

    def load(self, path: str) -> dict:
        return self.learner.load(Path(path))

    def close(self) -> None:
        import torch.distributed as dist

        if self.sender is not None:
            self.sender.close()
        if dist.is_initialized():
            dist.destroy_process_group()


class ActorRole:
    """One rollout actor (`actors.RolloutActor`) with its engine pinned to its cores."""

    def __init__(self, cfg, actor_id: int, model_dir: str, buffer_address: str, prompts, cores: list[int] | None,
                 initial_version: int = 0, skip: list | None = None, cursor: dict | None = None,
                 requeue: list | None = None):
        """skip: (epoch, prompt) pairs never to generate (trained, or held by the buffer); cursor and
        requeue: where a crashed predecessor's shard resumes (`actors.prompts` module docstring)."""
        if cores:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(cfg.rollout.kv_cache_gib))))
        from actors.actor import RolloutActor

        self.actor = RolloutActor(cfg, actor_id=actor_id, model_dir=model_dir, buffer_address=buffer_address,
                                  prompts=prompts, initial_version=initial_version)
        c = self.actor.core.cursor
        if skip:
            c.skip(skip)
        if cursor:
            c.load_state_dict(cursor)
        if requeue:
            c.requeue(requeue)

    def start(self) -> int:
        self.actor.start()
        return os.getpid()

    def connect_weight_sync(self, host: str, port: int) -> int:
        return self.actor.connect_weight_sync(host, port)

    def follow_weight_updates(self) -> None:
        self.actor.follow_weight_updates()

    def start_rollouts(self) -> None:
        self.actor.start_rollouts()

    def stop(self, drain: bool, timeout_s: float) -> None:
        self.actor.stop(drain=drain, timeout_s=timeout_s)

    def evaluate(self, items) -> dict:
        return self.actor.evaluate(items)

    def stats(self) -> dict:
        return self.actor.stats()

    def close(self) -> None:
        self.actor.close()

