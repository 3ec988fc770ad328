"""The learner rank, one of the two process roles the orchestrator places with Ray (the other is
`launch.processes.actor_role.ActorRole`), and what every role's process shares: its address (`node_host`), its
pid and host (`where`) and its log file (`to_log_file`).

Roles are plain classes (Ray-free, so `--serial` uses them directly); `launch.processes.process_graph` wraps them
with `ray.remote` and the resources of the config. CPU placement on one CPU machine: each learner rank
is pinned to the cores `launch.planning.placement` chose for it (`pin_to_cores`: sched_setaffinity + torch
threads); the actors are not pinned (their engines run on any core), so a core the learner leaves
idle while it waits for a batch generates.

Addresses: the services of a learner rank (rank 0's process-group store, the weight-sync sender) are
chosen in the rank's own process, on its own node (`node_host`), and advertised from there.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)


def node_host(cluster: bool) -> str:
    """The address a service of this process binds and advertises: this node's IP as Ray reports it
    when the run spans a cluster (`cluster`: the launcher's decision), loopback on a single machine."""
    if not cluster:
        from learner.distributed import LOOPBACK

        return LOOPBACK
    import ray

    return ray.util.get_node_ip_address()


def where() -> dict:
    """This process as `processes.json` lists it: pid and host name."""
    import socket

    return {"pid": os.getpid(), "host": socket.gethostname()}


LOG_FILE_ENV = "IMPALA_ROLE_LOG"  # set by `launch.processes.process_graph` for each Ray role: its run_dir/logs/<role>.log


def to_log_file() -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, which its children, vLLM's
    engine processes, inherit) to the file named by $IMPALA_ROLE_LOG, appended; no-op when unset
    (logging.verbose, --serial). Other programs' warnings and progress bars then land in
    run_dir/logs/ instead of the terminal (Ray forwards what a worker writes to Ray's own files).
    The file starts its part with `log_header`: a restarted actor appends to its predecessor's log,
    and a process killed before it wrote anything still shows there that it ran. (Ray's workers write
    unbuffered: what the process printed before a SIGKILL is in the file.)"""
    path = os.environ.get(LOG_FILE_ENV)
    if not path:
        return
    import sys

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, log_header(Path(path).stem, where()).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def log_header(role: str, at: dict) -> str:
    """The line a process writes into its role's log before anything else."""
    import time

    return f"--- {role}: pid {at['pid']} on {at['host']}, {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n"


def first_line(error: BaseException) -> str:
    """'Type: first line of the message' of an error (Ray's wrapper unwrapped)."""
    cause = getattr(error, "cause", None) or error
    return f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0][:200]}"


def named(role: str, pid, host, log) -> str:
    """How a fault message names a process: 'actor 0 (pid 17698 on vm; log runs/a/logs/actor-0.log)'
    (`log`: its log file, or how to read it; None leaves it out)."""
    return f"{role} (pid {pid} on {host}" + (f"; log {log})" if log else ")")


class LocalRole:
    """A role object in this process (`--serial`) behind a Ray actor handle's calls:
    `role.method.remote(...)` runs `method(...)` at once and returns what `ray.get` of it would."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        from types import SimpleNamespace

        return SimpleNamespace(remote=getattr(self._obj, name))


def pin_to_cores(cores: list[int] | None) -> None:
    """Restrict this process (and torch's intra-op pool) to `cores` (no-op when None)."""
    if not cores:
        return
    import torch

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(len(cores))


def rank0_rendezvous(world_size: int, cluster: bool) -> str | None:
    """The address learner rank 0 picks for the ranks' process group, on its own node:
    `tcp://<node_host(cluster)>:<a port free there>`; None for a world of one (no rendezvous:
    `learner.distributed.init_distributed` gives it an in-process store). `algo-train doctor`'s learner
    peer starts its process group from the same address, so it binds what rank 0 would."""
    if world_size == 1:
        return None
    from learner.distributed import free_port

    host = node_host(cluster)
    return f"tcp://{host}:{free_port(host)}"


class LearnerRank:
    """One FSDP rank (`learner.Learner`); rank 0 also owns the weight-sync sender.

    Rendezvous of the ranks: rank 0 is created first and picks the process group's address on its own
    node, `tcp://<node_host(cluster)>:<a port free there>` (`rendezvous()` returns it); the other ranks
    are created with it (`rendezvous`). MASTER_ADDR/MASTER_PORT are set to the same address. The
    `Learner` is built on a background thread, since rank 0's `init_process_group` waits for the
    others, which exist only once rank 0 has answered `rendezvous()`; every method waits for the
    build and raises its error. A world of one rank needs no rendezvous (`rank0_rendezvous`).
    Interfaces: see `learner.distributed.init_distributed` (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME).
    """

    def __init__(self, cfg, rank: int, world_size: int, model_dir: str, cores: list[int] | None = None,
                 cluster: bool = False, rendezvous: str | None = None):
        to_log_file()
        pin_to_cores(cores)
        import transformers

        transformers.utils.logging.disable_progress_bar()  # its weight-loading bar would clobber the progress line
        from learner.learner import Learner

        if rank == 0:
            rendezvous = rank0_rendezvous(world_size, cluster)
        elif rendezvous is None:
            raise ValueError(f"learner rank {rank} needs the rendezvous address rank 0 chose")
        if rendezvous is not None:
            url = urlsplit(rendezvous)
            os.environ.update({"MASTER_ADDR": url.hostname, "MASTER_PORT": str(url.port)})
        self.cfg, self.rank, self.cluster, self._rendezvous = cfg, rank, cluster, rendezvous
        self.sender = None
        self._staging = None  # a closed group's staging memory, for the next group (reset_sender)
        self._push: Future | None = None  # rank 0's push in flight (push_weights / push_result)
        self._push_thread = ThreadPoolExecutor(1, thread_name_prefix="weight-push")
        build = ThreadPoolExecutor(1, thread_name_prefix=f"learner-rank-{rank}")
        self._built = build.submit(Learner, cfg, rank=rank, world_size=world_size, model_dir=model_dir,
                                   init_method=rendezvous)
        build.shutdown(wait=False)

    def rendezvous(self) -> str | None:
        """`tcp://host:port` of the ranks' process group, chosen by rank 0 (None for a world of one)."""
        return self._rendezvous

    @property
    def learner(self):
        """The built `Learner` (waits for the build; raises its error)."""
        return self._built.result()

    def reset_sender(self, num_receivers: int, token: str) -> tuple[str, int] | None:
        """(Re)create the weight-sync group for `num_receivers` actors, admitting only peers that prove
        `token` (the run's `RunSecrets.weight_sync_token`); returns its address, on this node
        (`node_host`). Waits for the learner first: a failed build surfaces here, not at the first push.
        With no receivers (every actor is a successor still starting) the group is closed: None."""
        from weightsync.sender import WeightSender

        self._built.result()
        staging = None  # the pushes' host memory, kept from one group to the next (`weightsync.staging`)
        if self.sender is not None:
            self.sender.close()  # a push still in flight on it fails at once and is dropped:
            self.push_result(raise_error=False)  # the new group starts with a full push of the current version
            staging = self.sender.staging_handover()
            self.sender = None
        if num_receivers == 0:
            self._staging = staging
            return None
        ws = self.cfg.weight_sync
        engine = self.cfg.rollout.engine
        self.sender = WeightSender(num_receivers, host=node_host(self.cluster), port=0, token=token,
                                   bucket_mb=ws.bucket_mb, timeout_s=ws.deadline_s,
                                   connect_timeout_s=ws.connect_timeout_s, backend=ws.backend,
                                   tp=engine.tensor_parallel_size,
                                   mode="full" if self.cfg.model.lora.adapter_sync else ws.mode,  # an adapter
                                   full_every=ws.full_every, min_gbps=ws.min_gbps,  # is small: pushed whole
                                   staging=staging or self._staging)
        self._staging = None
        return self.sender.address

    def connect_sender(self) -> None:
        """Allocate the pushes' page-locked host memory from the policy's shapes (a GPU learner: seconds
        for a 7B model, spent here while the actors join instead of in the first push), then wait for
        every actor to join the group."""
        if self.sender is not None:
            from learner.gather import serving_shapes
            from learner.lora import adapter_shapes

            learner = self.learner
            shapes = adapter_shapes if self.cfg.model.lora.adapter_sync else serving_shapes
            self.sender.reserve_staging(shapes(learner.policy, learner.compute_dtype), learner.device)
            self.sender.connect()

    def step(self, groups, version: int) -> dict:
        return self.learner.step(groups, version)

    def push_weights(self, version: int) -> None:
        """Start pushing the current weights as `version`; every rank must call this (the weights are
        gathered collectively, in the serving dtype, on the calling thread). Rank 0 then sends them on a
        background thread, so the learner goes on (pulling and training the next batch) while they
        travel; `push_result` waits for that send. A push still in flight is waited for first."""
        from weightsync.sender import drain

        weights = self.learner.named_full_weights(self.learner.compute_dtype)
        if self.sender is None:
            drain(weights)
            return
        self.push_result()
        payload = self.sender.prepare(weights, version)  # owns copies: the optimiser may now move on
        self._push = self._push_thread.submit(self.sender.send, payload)

    def push_result(self, raise_error: bool = True) -> dict:
        """Stats of the push in flight once it has landed on every actor ({} when none is in flight);
        its `WeightSyncError` is raised here (or only logged when not `raise_error`)."""
        push, self._push = self._push, None
        if push is None:
            return {}
        try:
            return push.result()
        except Exception:
            if raise_error:
                raise
            logger.warning("a weight push in flight was dropped", exc_info=True)
            return {}

    def where(self) -> dict:
        return where()

    def save(self, path: str, extra_state: dict) -> str:
        return str(self.learner.save(Path(path), extra_state))

    def load(self, path: str) -> dict:
        return self.learner.load(Path(path))

    def close(self) -> None:
        import torch.distributed as dist

        if self.sender is not None:
            self.sender.close()
            self.push_result(raise_error=False)
        self._push_thread.shutdown(wait=False)
        if dist.is_initialized():
            dist.destroy_process_group()
