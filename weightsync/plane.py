"""Data planes of the weight sync: how the bytes of one push travel from learner rank 0 to the engines.

The control plane (``weightsync.sender.WeightSender``: admission, push announcements, acks/nacks,
abort keys, heartbeats, deadlines, failure diagnosis) is the same for every backend; a data plane is
the small piece that forms the transfer group and broadcasts a ``Payload``:
  - ``GlooPlane`` (here): CPU, gloo over TCP, bucketed (``weightsync.packing``) into our vLLM engine
    ``weightsync.gloo_engine`` (registered as backend "gloo"); what CI runs;
  - an NCCL plane (``weightsync.nccl_plane``) into vLLM's own NCCL engines on GPUs.
Each is registered by name with its engine in ``weightsync.backends``, and the sender builds the one
the run names with ``for_sender(PlaneContext)``.
Contract with the control plane: ``init_info(rank)`` is published (JSON, under the group's secret
prefix) before that receiver is admitted, and the receiver passes it unchanged as the init_info of
``init_weight_transfer_engine``; ``connect`` runs while the receivers join inside that call;
``update_info(payload)`` is published with the push announcement and the receiver passes
``{"version", "seq", **update_info}`` to ``update_weights``; ``send`` must honour its deadline and
raise ``WeightSyncError`` past it (never hang); ``abort`` destroys the group and is idempotent.
``send`` must ``payload.wait_ready()`` before reading the payload's tensors (staged host copies on a
CUDA learner, ``weightsync.staging``). ``send`` runs on whatever thread calls ``WeightSender.send`` (possibly a background one while the
learner's thread runs FSDP collectives): a plane must never use the default process group.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from weightsync.backends import GLOO_ENGINE_BACKEND
from weightsync.gloo_group import new_gloo_group, send_bucket
from weightsync.packing import PATCH_BLOCK, Bucket, Patch, pack_buckets, pack_patch_buckets, patch_nbytes
from weightsync.protocol import WeightSyncError
from weightsync.staging import wait_ready

DEFAULT_MIN_GBPS = 0.1  # weight_sync.min_gbps's default: 10^8 bytes/s, about a 1 GbE link


def push_deadline_s(timeout_s: float, nbytes: int, min_gbps: float) -> float:
    """Deadline of a plane's whole push (NCCL's; gloo's is per bucket): ``timeout_s`` (every engine's
    pause, the broadcast's start) plus the time ``nbytes`` take at ``min_gbps`` GB/s (10^9 bytes a
    second), the slowest link the run allows for (``weight_sync.min_gbps``)."""
    return float(timeout_s) + nbytes / (min_gbps * 1e9)


@dataclass
class Payload:
    """One push, already gathered and cast to the wire dtype (rank 0 only). Exactly one of ``full``
    (dense: every tensor) and ``patches`` (delta: only the tensors with changed elements) is set."""

    version: int
    seq: int
    full: list[tuple[str, torch.Tensor]] | None = None
    patches: list[Patch] | None = None
    changed_frac: float = 1.0  # changed elements / all elements (1.0 for a dense push)
    ready: object | None = None  # staging event (``weightsync.staging``): the tensors are valid once it completed

    def wait_ready(self) -> None:
        """Block until the staged tensors are valid (a no-op when nothing was staged: CPU runs)."""
        wait_ready(self.ready)

    def __post_init__(self) -> None:
        if (self.full is None) == (self.patches is None):
            raise ValueError("a Payload carries exactly one of full (dense) and patches (delta)")

    @property
    def mode(self) -> str:
        return "full" if self.full is not None else "delta"


@dataclass(frozen=True)
class PlaneContext:
    """What the control plane gives the data plane it builds (``SenderPlane.for_sender``)."""

    store: dist.Store  # the group's store (the secret prefix applied): receivers read plane keys from it
    host: str  # the sender's advertised address, and its store's port
    port: int
    prefix: str  # the group's secret key prefix (for receivers that open their own store client)
    num_receivers: int  # engines (each of ``tp`` workers)
    tp: int  # workers per engine (TP x PP), for planes that address every worker
    bucket_bytes: int  # largest packed message
    timeout_s: float  # deadline of one push's transfer
    connect_timeout_s: float  # deadline of the rendezvous
    mirror: bool  # delta mode: the engines keep the last dense push and apply patches to it
    min_gbps: float = DEFAULT_MIN_GBPS  # planes with one deadline per push add bytes / this (GB/s) to it


class SenderPlane(Protocol):
    """A data plane, registered by name in ``weightsync.backends``."""

    backend: str  # its weight_sync.backend name (logged, reported in stats)
    engine_backend: str  # WeightTransferConfig backend name the actors' vLLM engines must be built with

    @classmethod
    def for_sender(cls, ctx: PlaneContext) -> SenderPlane: ...

    def init_info(self, rank: int) -> dict: ...

    def connect(self, timeout_s: float) -> None: ...

    def update_info(self, payload: Payload) -> dict: ...

    def send(self, payload: Payload, timeout_s: float) -> dict: ...

    def abort(self) -> None: ...

    # optional: ``patch_cost(changed, numel, itemsize)``, the wire bytes of one tensor's patch (the delta
    # encoder's dense fallback; default: ``weightsync.delta.int32_patch_nbytes``, vLLM's sparse format)


def gloo_patch_cost(changed: int, numel: int, itemsize: int) -> int:
    """Wire bytes of one tensor's patch on the gloo plane (``weightsync.packing``'s patch buckets)."""
    return patch_nbytes(changed, itemsize, -(-numel // PATCH_BLOCK))


class GlooPlane:
    """Rank 0 of a gloo group with the receivers' transfer engines (ranks 1..N), built over the
    control plane's group store. Buckets of at most ``bucket_bytes`` are packed on the caller's thread
    while a broadcast thread sends the previous one. ``mirror``: the engines keep the last dense push
    (checkpoint names, wire dtype, CPU) and apply patches to it (the sender runs in delta mode).
    ``buckets_sent`` counts the buckets of the current push whose broadcast completed (the control
    plane compares it with each receiver's progress key to name the one that fell behind)."""

    backend = "gloo"
    engine_backend = GLOO_ENGINE_BACKEND
    patch_cost = staticmethod(gloo_patch_cost)

    def __init__(self, store: dist.Store, address: tuple[str, int], prefix: str, num_receivers: int, *,
                 bucket_bytes: int, timeout_s: float, connect_timeout_s: float, mirror: bool):
        self._store, self._address, self._prefix = store, address, prefix
        self.world_size = num_receivers + 1
        self.bucket_bytes = bucket_bytes
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.mirror = mirror
        self.buckets_sent = 0
        self._pg: dist.ProcessGroupGloo | None = None

    @classmethod
    def for_sender(cls, ctx: PlaneContext) -> GlooPlane:
        return cls(ctx.store, (ctx.host, ctx.port), ctx.prefix, ctx.num_receivers, bucket_bytes=ctx.bucket_bytes,
                   timeout_s=ctx.timeout_s, connect_timeout_s=ctx.connect_timeout_s, mirror=ctx.mirror)

    def init_info(self, rank: int) -> dict:
        host, port = self._address
        return {"host": host, "port": port, "prefix": self._prefix, "rank": rank, "world_size": self.world_size,
                "timeout_s": self.timeout_s, "connect_timeout_s": self.connect_timeout_s, "mirror": self.mirror}

    def connect(self, timeout_s: float) -> None:
        if self._pg is None:
            self._pg = new_gloo_group(self._store, 0, self.world_size, self.timeout_s, local_host=self._address[0],
                                      connect_timeout_s=timeout_s)

    def update_info(self, payload: Payload) -> dict:
        return {"delta": payload.patches is not None}

    def send(self, payload: Payload, timeout_s: float) -> dict:
        if self._pg is None:
            raise WeightSyncError("gloo plane not connected (or aborted after a failure)")
        payload.wait_ready()
        if payload.full is not None:
            buckets = pack_buckets(payload.full, self.bucket_bytes, version=payload.version, seq=payload.seq)
        else:
            buckets = pack_patch_buckets(payload.patches, self.bucket_bytes, version=payload.version,
                                         seq=payload.seq)
        stats = {"bytes": 0, "buckets": 0, "tensors": 0}
        self.buckets_sent = 0
        self._broadcast(self._pg, buckets, timeout_s, stats)
        return stats

    def abort(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            with contextlib.suppress(Exception):
                pg.abort()

    def _broadcast(self, pg: dist.ProcessGroupGloo, buckets, timeout_s: float, stats: dict) -> None:
        """Pack on this thread, broadcast on a sender thread; a watchdog here raises ``WeightSyncError`` when
        one bucket's broadcast outlives its deadline (gloo's own timeout should fire first)."""
        q: queue.Queue[Bucket | None] = queue.Queue(maxsize=1)
        state = {"busy_since": None, "error": None}

        def sender_loop() -> None:
            try:
                while (b := q.get()) is not None:
                    state["busy_since"] = time.monotonic()
                    send_bucket(pg, b, timeout_s)
                    state["busy_since"] = None
                    self.buckets_sent += 1
            except BaseException as e:
                state["error"] = e

        thread = threading.Thread(target=sender_loop, name="weightsync-send", daemon=True)
        thread.start()

        def check() -> None:
            if state["error"] is not None:
                raise WeightSyncError(f"broadcast failed: {state['error']}") from state["error"]
            since = state["busy_since"]
            if since is not None and time.monotonic() - since > timeout_s + 2.0:
                raise WeightSyncError(f"broadcast exceeded its {timeout_s:.0f} s deadline (watchdog)")
            if not thread.is_alive():
                raise WeightSyncError("sender thread exited unexpectedly")

        def put(item: Bucket | None) -> None:
            while True:
                check()
                try:
                    q.put(item, timeout=0.05)
                    return
                except queue.Full:
                    continue

        try:
            for b in buckets:
                stats["bytes"] += b.header.nbytes
                stats["buckets"] += 1
                stats["tensors"] += len(b.header.names)
                put(b)
            put(None)
            while thread.is_alive():
                check()
                thread.join(0.02)
            if state["error"] is not None:
                raise WeightSyncError(f"broadcast failed: {state['error']}") from state["error"]
        finally:
            if thread.is_alive():  # unblock the loop if we bail out while it waits for work
                with contextlib.suppress(queue.Full):
                    q.put_nowait(None)
