"""The gloo data plane (learner rank 0, CPU): buckets of packed weights (``weightsync.packing``)
broadcast over a gloo group (``weightsync.gloo.group``) to our vLLM engine ``weightsync.gloo.engine``
(backend "gloo"). The contract it keeps with the control plane: ``weightsync.plane``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import torch.distributed as dist

from weightsync.backends import GLOO_ENGINE_BACKEND
from weightsync.gloo.group import new_gloo_group, send_bucket
from weightsync.packing import PATCH_BLOCK, Bucket, pack_buckets, pack_patch_buckets, patch_nbytes
from weightsync.plane import Payload, PlaneContext
from weightsync.protocol import WeightSyncError


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
