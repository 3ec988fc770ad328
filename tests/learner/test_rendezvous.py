"""Learner ranks meet at the address rank 0 chose: rank 0 (`launch.processes.roles.LearnerRank`) picks host and
port in its own process and hosts the process group's store there; rank 1 is created only afterwards,
with that address. (Only loopback exists here without network namespaces; the two-host test covers
a node IP.)"""

import os
import queue
import time
from urllib.parse import urlsplit

import psutil
import pytest
import torch.multiprocessing as mp

from launch.processes.roles import LearnerRank, node_host

pytestmark = pytest.mark.slow


def _rank(rank: int, model_dir: str, rendezvous: str | None, out) -> None:
    import torch
    import torch.distributed as dist

    from tests.learner.helpers import make_cfg

    lr = LearnerRank(make_cfg(), rank, 2, model_dir, rendezvous=rendezvous)
    if rank == 0:
        out.put(("chosen", lr.rendezvous()))
    lr.learner  # noqa: B018 - waits until the group formed and the model is built
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    port = urlsplit(lr.rendezvous()).port
    hosts = any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                for c in psutil.Process().net_connections("tcp"))
    out.put((rank, os.getpid(), dist.get_world_size(), float(t), os.environ["MASTER_ADDR"],
             int(os.environ["MASTER_PORT"]), hosts))
    lr.close()


def _next(out, procs: list, timeout_s: float = 300.0):
    """The next report of a rank process; fails at once when one of them died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=1.0)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a rank process died (exit codes {dead}); see its traceback above"
    raise AssertionError(f"no report from the ranks within {timeout_s:.0f} s")


def test_two_ranks_meet_where_rank_0_chose(tiny_dir):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    first = ctx.Process(target=_rank, args=(0, str(tiny_dir), None, out), daemon=True)
    first.start()
    procs = [first]
    try:
        what, chosen = _next(out, procs)  # rank 1 does not exist yet: the address is rank 0's alone
        assert what == "chosen"
        url = urlsplit(chosen)
        assert (url.scheme, url.hostname) == ("tcp", "127.0.0.1")  # single machine: loopback
        procs.append(ctx.Process(target=_rank, args=(1, str(tiny_dir), chosen, out), daemon=True))
        procs[1].start()
        got = {r[0]: r for r in (_next(out, procs), _next(out, procs))}
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for rank, pid, world, total, master_addr, master_port, hosts in got.values():
        assert pid == procs[rank].pid
        assert (world, total) == (2, 3.0)  # all_reduce of 1 (rank 0) + 2 (rank 1)
        assert (master_addr, master_port) == ("127.0.0.1", url.port)
        assert hosts == (rank == 0)  # the store listens in rank 0's process only


def test_rank_above_0_needs_rank_0s_address(tiny_dir):
    from tests.learner.helpers import make_cfg

    with pytest.raises(ValueError, match="rendezvous address rank 0 chose"):
        LearnerRank(make_cfg(), 1, 2, str(tiny_dir))


def test_services_bind_the_node_ip_on_a_cluster_and_loopback_otherwise(monkeypatch):
    import ray

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "198.18.0.1")
    assert node_host(cluster=True) == "198.18.0.1"
    assert node_host(cluster=False) == "127.0.0.1"
