"""Process-group setup and the few collectives the learner needs besides FSDP's own.

- `init_distributed`: gloo on CPU, NCCL on GPU; a world of one gets an in-process store (no rendezvous,
  no launcher) and leaves the environment as it found it. Several ranks meet at the address rank 0 chose on
  its own node (`free_port` on the host it advertises; see `launch.processes.roles.LearnerRank`).
- `gather_rows`: every rank computes model outputs (π_prox, reference, PRM) for its own rows only;
  the advantage needs them for the whole step, so they are all-gathered into the global row order.
- `reduce_weighted`: metrics of micro-batches on all ranks → one weighted mean per key.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"  # the single-machine default rendezvous host


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` (an IPv4 address of this node, the one the service will bind) right now;
    the caller binds it next, so call this on the node that serves."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def default_device(rank: int) -> torch.device:
    """cuda:LOCAL_RANK (or rank modulo the GPU count) when GPUs exist, else CPU."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(rank: int, world_size: int, device: torch.device, init_method: str | None = None,
                     timeout_s: float = 600.0) -> None:
    """Initialise the default process group (no-op when one exists with the same size).

    init_method: e.g. "tcp://host:port" (rank 0 hosts the store there, the others connect); default:
    env:// when MASTER_ADDR is set, else (world of one only) an in-process `HashStore`: nothing to serve
    or dial. A world of one changes no environment variable: the process may go on to host the weight
    sync, whose gloo group and NCCL bootstrap read GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, and on a
    cluster those must not say loopback (gloo's device for the group of one is made on loopback while
    the group is built, then the variables are restored: `loopback_while`).

    Listening: a "tcp://host:port" rendezvous store listens on `host` only (`rendezvous_store`: torch's
    own would bind every interface); a loopback host (one machine) also keeps gloo's sockets on the
    loopback interface (`GLOO_SOCKET_IFNAME`, and `NCCL_SOCKET_IFNAME` for NCCL's bootstrap, set for
    this process when unset). On a cluster gloo binds the address the node's hostname resolves to,
    which on many hosts is loopback (Debian's 127.0.1.1), so ranks on different nodes cannot reach
    each other; set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME for NCCL) to the interface of the nodes'
    network on every node (in the environment `ray start` runs in). A value set by the user is
    respected, never overridden.
    """
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise RuntimeError(f"a process group of size {dist.get_world_size()} (rank {dist.get_rank()}) "
                               f"already exists; the learner was asked for rank {rank} of {world_size}")
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    if init_method is None:
        if "MASTER_ADDR" in os.environ:
            init_method = "env://"
        elif world_size == 1:
            with loopback_while():
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
            return
        else:
            raise RuntimeError("world_size > 1 needs MASTER_ADDR/MASTER_PORT or an init_method "
                               "(set by whatever starts the ranks, e.g. launch.processes.roles.LearnerRank)")
    url = urlsplit(init_method)
    if url.scheme != "tcp":  # env:// (a launcher's own store), file://: as torch does it
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timeout)
        return
    if ipaddress.ip_address(socket.gethostbyname(url.hostname)).is_loopback:
        keep_on_loopback()
    store = rendezvous_store(url.hostname, url.port, rank == 0, timeout_s)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def loopback_interface() -> str:
    """The name of this machine's loopback interface ("lo" on Linux)."""
    names = [name for _, name in socket.if_nameindex()]
    return "lo" if "lo" in names or not names else next((n for n in names if n.startswith("lo")), "lo")


def keep_on_loopback() -> None:
    """gloo (and NCCL's bootstrap) of this process bind the loopback interface, unless the user named
    one (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME are respected, never overridden). For one-machine runs:
    gloo would otherwise bind whatever the hostname resolves to, which may be a network address."""
    lo = loopback_interface()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)


@contextlib.contextmanager
def loopback_while():
    """`keep_on_loopback` for the duration of the block only: the variables the user did not set are
    removed again after it (for a group of one, whose gloo device is made when the group is built)."""
    unset = [k for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k not in os.environ]
    keep_on_loopback()
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)


def rendezvous_store(host: str, port: int, is_server: bool, timeout_s: float) -> dist.TCPStore:
    """The process group's store at host:port: rank 0 serves it on `host` only
    (`weightsync.protocol.serve_store`: torch's own server binds every interface), the others connect."""
    from weightsync.protocol import serve_store

    if is_server:
        return serve_store(host, port, timeout_s)
    return dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s))


def comm_device() -> torch.device:
    """Where collective tensors must live (NCCL: the current GPU; gloo: CPU)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_rows(local: torch.Tensor, shards: list[list[int]], rank: int, num_rows: int) -> torch.Tensor:
    """All-gather per-row tensors [b_rank, T] (rank's rows in `shards[rank]` order) into [num_rows, T].

    Every rank passes the same `shards` (global row indices per rank) and width T.
    """
    world = len(shards)
    if world == 1:
        out = local.new_zeros((num_rows,) + tuple(local.shape[1:]))
        out[torch.tensor(shards[0], dtype=torch.long, device=local.device)] = local
        return out
    dtype = local.dtype
    dev = comm_device()
    send = local.to(dev, torch.float32) if dtype == torch.bool else local.to(dev)
    most = max(len(s) for s in shards)
    padded = send.new_zeros((most,) + tuple(send.shape[1:]))
    padded[:send.shape[0]] = send
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    out = send.new_zeros((num_rows,) + tuple(send.shape[1:]))
    for r, idx in enumerate(shards):
        if idx:
            out[torch.tensor(idx, dtype=torch.long, device=dev)] = parts[r][:len(idx)]
    out = out.to(local.device)
    return out.bool() if dtype == torch.bool else out


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=comm_device())
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.cpu().tolist()


def all_reduce_extremes(value: int) -> tuple[int, int]:
    """(min, max) of an integer over ranks."""
    t = torch.tensor([value, -value], dtype=torch.int64, device=comm_device())
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t[0]), int(-t[1])


def reduce_weighted(sums: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
    """Σ_ranks sums[k] / Σ_ranks weights[k] for the union of keys over ranks."""
    keys = set(sums)
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[list[str]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, sorted(keys))
        keys = set().union(*map(set, gathered))
    order = sorted(keys)
    total = all_reduce_sum([sums.get(k, 0.0) for k in order] + [weights.get(k, 0.0) for k in order])
    n = len(order)
    return {k: total[i] / total[n + i] for i, k in enumerate(order) if total[n + i] > 0}
