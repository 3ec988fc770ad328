"""Wire protocol shared by the learner-side sender and the actor-side receivers (torch only).

Why a separate module: the learner must not import vllm, while the receiving end lives inside a
vLLM worker. Both ends need the same rendezvous keys, the same gloo group construction and the same
bucket framing, so those live here and nothing here imports vllm.

Control plane: a ``torch.distributed.TCPStore`` hosted by the sender at ``(host, port)``.
  config                      JSON {world_size, timeout_s, connect_timeout_s}: the sender's settings,
                              which every receiver adopts (world_size counts the sender as rank 0)
  rank_counter                receivers draw ranks 1..N from it with ``add``
  rank/<r>                    JSON {name, pid, host} of receiver r's actor process (the helper)
  worker/<r>                  JSON {name, pid, host} of the vLLM worker process that holds rank r
  hb/<r>                      heartbeat counter bumped by the process that holds rank r's gloo group
  push/<k>                    JSON {version} announcing the k-th push (k = 1, 2, ...)
  progress/<k>/<r>            buckets of push k that rank r has received
  ack/<k>/<r>, nack/<k>/<r>   JSON outcome of push k on rank r (loaded version, or the error)
  abort/<k>                   set by the sender when it gives up on push k, so the surviving
                              receivers stop waiting at once instead of at their gloo timeout
Data plane: a gloo process group of ``world_size`` ranks built over a ``PrefixStore`` of that store
(independent of any default process group, so it coexists with FSDP's and vLLM's own groups).
Every collective gets an explicit timeout; gloo raises when it expires (checked on this stack for a
peer killed with SIGKILL and one frozen with SIGSTOP mid-broadcast).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from weightsync.packing import Bucket, BucketHeader

BACKEND_NAME = "gloo"  # the name our vLLM weight-transfer engine is registered under
GLOO_PREFIX = "weightsync/gloo"
ABORTED_BY_SENDER = "sender aborted the push"  # receivers' error text when the sender gave up first
HEARTBEAT_PERIOD_S = 0.25


class WeightSyncError(RuntimeError):
    """A weight push failed: a receiver died, hung past the deadline, or reported an error."""

    def __init__(self, message: str, *, failed_ranks: dict[int, str] | None = None):
        super().__init__(message)
        self.failed_ranks = dict(failed_ranks or {})


def key_rank(rank: int) -> str:
    return f"rank/{rank}"


def key_worker(rank: int) -> str:
    return f"worker/{rank}"


def key_heartbeat(rank: int) -> str:
    return f"hb/{rank}"


def key_push(seq: int) -> str:
    return f"push/{seq}"


def key_progress(seq: int, rank: int) -> str:
    return f"progress/{seq}/{rank}"


def key_abort(seq: int) -> str:
    return f"abort/{seq}"


def key_ack(seq: int, rank: int) -> str:
    return f"ack/{seq}/{rank}"


def key_nack(seq: int, rank: int) -> str:
    return f"nack/{seq}/{rank}"


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """Client connection to the sender's store (raises after ``timeout_s`` if nobody listens)."""
    return dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s))


def get_json(store: dist.Store, key: str) -> dict:
    return json.loads(store.get(key).decode())


def set_json(store: dist.Store, key: str, value: dict) -> None:
    store.set(key, json.dumps(value))


def this_host() -> str:
    return socket.gethostname()


def new_gloo_group(store: dist.Store, rank: int, world_size: int, timeout_s: float,
                   connect_timeout_s: float | None = None) -> dist.ProcessGroupGloo:
    """A standalone gloo group (blocks until all ``world_size`` ranks connected). ``timeout_s`` is
    the group's default deadline for collectives; the rendezvous itself waits on the store, whose
    timeout is set to ``connect_timeout_s`` for the duration. gloo picks the interface from the
    hostname like torch does (``GLOO_SOCKET_IFNAME`` overrides)."""
    if connect_timeout_s is not None:
        store.set_timeout(timedelta(seconds=connect_timeout_s))
    return dist.ProcessGroupGloo(dist.PrefixStore(GLOO_PREFIX, store), rank, world_size,
                                 timedelta(seconds=timeout_s))


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


def abort_probe(store: dist.Store, seq: int) -> Callable[[], str | None]:
    """``aborted`` callback for ``iter_buckets``: the sender's abort message for push ``seq``, if any."""
    key = key_abort(seq)

    def probe() -> str | None:
        try:
            return store.get(key).decode() if store.check([key]) else None
        except Exception as e:  # the sender's store is gone: so is the sender
            return f"sender unreachable ({e})"

    return probe


class Heartbeat:
    """Bumps ``hb/<rank>`` every ``period_s`` from a daemon thread so the sender can tell a dead
    receiver (counter frozen) from a slow one. Runs in the process that owns the gloo rank."""

    def __init__(self, host: str, port: int, rank: int, period_s: float = HEARTBEAT_PERIOD_S):
        self._store = connect_store(host, port, timeout_s=30)
        self._key = key_heartbeat(rank)
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"weightsync-hb-{rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._store.add(self._key, 1)
            except Exception:  # the sender went away; nothing to report to
                return
            self._stop.wait(self._period)

    def stop(self) -> None:
        self._stop.set()


def _maybe_json(store: dist.Store, key: str) -> dict:
    try:
        return get_json(store, key) if store.check([key]) else {}
    except Exception:
        return {}


def describe_receiver(store: dist.Store, rank: int) -> str:
    actor, worker = _maybe_json(store, key_rank(rank)), _maybe_json(store, key_worker(rank))
    return (f"rank {rank} (engine {actor.get('name', '?')!r}, actor pid {actor.get('pid', '?')}, "
            f"transfer-rank pid {worker.get('pid', '?')} on {worker.get('host', actor.get('host', '?'))})")


def stalled_heartbeats(store: dist.Store, ranks: list[int], window_s: float) -> list[int]:
    """Ranks whose heartbeat counter did not move during ``window_s`` (i.e. dead or frozen)."""

    def read() -> dict[int, int]:
        out = {}
        for r in ranks:
            out[r] = store.add(key_heartbeat(r), 0)
        return out

    before = read()
    time.sleep(window_s)
    after = read()
    return [r for r in ranks if after[r] == before[r]]


def process_info(name: str) -> dict:
    return {"name": name, "pid": os.getpid(), "host": this_host()}
