"""The gloo group of the gloo data plane and its bucket framing (torch only; both ends use it).

A standalone gloo process group of ``world_size`` ranks is built over a ``PrefixStore`` of the
control plane's group keys (``weightsync.protocol``), independent of any default process group, so
it coexists with FSDP's and vLLM's own groups. Rank 0 (the learner's ``weightsync.gloo.plane.GlooPlane``)
broadcasts each ``weightsync.packing.Bucket`` as three collectives: a length prefix, the JSON header
and the payload. Every collective gets an explicit timeout; gloo raises when it expires (checked on
this stack for a peer killed with SIGKILL and one frozen with SIGSTOP mid-broadcast).
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from weightsync.packing import Bucket, BucketHeader
from weightsync.protocol import ABORTED_BY_SENDER, WeightSyncError

GLOO_PREFIX = "weightsync/gloo"


def local_address_toward(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (connecting a UDP socket sends nothing)."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        return s.getsockname()[0]


def gloo_devices(local_host: str) -> list:
    """What this rank's gloo transport binds: the interfaces named in ``GLOO_SOCKET_IFNAME``
    (comma-separated) when the user set it, else the address ``local_host``: the sender's advertised
    host, a receiver's ``local_address_toward`` the sender (never the hostname's address, which on
    many hosts resolves to loopback, so that remote peers would dial their own loopback)."""
    names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    if names:
        return [dist.ProcessGroupGloo.create_device(interface=n) for n in names]
    return [dist.ProcessGroupGloo.create_device(hostname=local_host)]


def new_gloo_group(store: dist.Store, rank: int, world_size: int, timeout_s: float, *, local_host: str,
                   connect_timeout_s: float | None = None) -> dist.ProcessGroupGloo:
    """A standalone gloo group (blocks until all ``world_size`` ranks connected) on ``gloo_devices(local_host)``.
    ``timeout_s`` is the group's default deadline for collectives; the rendezvous itself waits on
    the store, whose timeout is set to ``connect_timeout_s`` for the duration."""
    if connect_timeout_s is not None:
        store.set_timeout(timedelta(seconds=connect_timeout_s))
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = gloo_devices(local_host)
    opts._timeout = timedelta(seconds=timeout_s)
    return dist.ProcessGroupGloo(dist.PrefixStore(GLOO_PREFIX, store), rank, world_size, opts)


def _bcast(pg: dist.ProcessGroupGloo, t: torch.Tensor, timeout: timedelta) -> None:
    pg.broadcast(t, 0, timeout).wait(timeout)


def send_bucket(pg: dist.ProcessGroupGloo, bucket: Bucket, timeout_s: float) -> None:
    """Broadcast one bucket from rank 0: prefix, header, payload (three collectives, one deadline
    each)."""
    timeout = timedelta(seconds=timeout_s)
    raw = bucket.header.encode()
    prefix = torch.tensor([len(raw), bucket.header.nbytes], dtype=torch.int64)
    _bcast(pg, prefix, timeout)
    _bcast(pg, torch.frombuffer(bytearray(raw), dtype=torch.uint8), timeout)
    if bucket.header.nbytes:
        _bcast(pg, bucket.payload, timeout)


def recv_bucket(pg: dist.ProcessGroupGloo, timeout_s: float) -> Bucket:
    """Receive one bucket broadcast by rank 0 into a freshly allocated buffer (never reused: vLLM's
    layerwise reload may hold views of it until a whole layer has arrived)."""
    timeout = timedelta(seconds=timeout_s)
    prefix = torch.empty(2, dtype=torch.int64)
    _bcast(pg, prefix, timeout)
    header_len, nbytes = (int(x) for x in prefix.tolist())
    if not (0 < header_len < (64 << 20)) or nbytes < 0:
        raise WeightSyncError(f"corrupt bucket prefix {prefix.tolist()}")
    raw = torch.empty(header_len, dtype=torch.uint8)
    _bcast(pg, raw, timeout)
    header = BucketHeader.decode(raw.numpy().tobytes())
    if header.nbytes != nbytes:
        raise WeightSyncError(f"bucket {header.index}: prefix says {nbytes} bytes, header {header.nbytes}")
    payload = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        _bcast(pg, payload, timeout)
    return Bucket(header, payload)


def iter_buckets(pg: dist.ProcessGroupGloo, timeout_s: float, prefetch: int = 1,
                 aborted: Callable[[], str | None] | None = None) -> Iterator[Bucket]:
    """Receive the buckets of one push, up to the one flagged ``last``. A background thread keeps
    receiving up to ``prefetch`` buckets ahead, so the network transfer of bucket i+1 overlaps the
    caller loading bucket i (gloo's waits release the GIL). Errors surface at the caller's ``next``.

    ``aborted`` is polled while waiting: when it returns a message (the sender gave up on this push,
    see ``key_abort``) we raise at once instead of sitting out gloo's timeout; the receive thread is
    left to time out on its own and the group must be re-initialised."""
    q: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            while True:
                b = recv_bucket(pg, timeout_s)
                if not put(b) or b.header.last:
                    return
        except BaseException as e:
            put(e)

    thread = threading.Thread(target=run, name="weightsync-recv", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                msg = aborted() if aborted is not None else None
                if msg:
                    raise WeightSyncError(f"{ABORTED_BY_SENDER}: {msg}") from None
                continue
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.header.last:
                return
    finally:
        stop.set()
