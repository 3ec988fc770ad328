"""Wire protocol shared by the learner-side sender and the actor-side receivers (torch only).

Why a separate module: the learner must not import vllm, while the receiving end lives inside a
vLLM worker. Both ends need the same rendezvous keys, the same gloo group construction and the same
bucket framing, so those live here and nothing here imports vllm.

Control plane: a ``torch.distributed.TCPStore`` hosted by the sender at ``(host, port)``. A TCPStore
has no access control and listens on every interface, so the keys come in two namespaces.
Public keys (anyone who reaches the port may read and write them):
  config                      JSON {world_size, timeout_s, connect_timeout_s, nonce, backend,
                              engine_backend}: the sender's settings, which every receiver adopts
                              (world_size counts the sender as rank 0); ``nonce`` is fresh for every
                              sender; ``backend`` names its data plane (``weightsync.plane``), whose
                              vLLM engine backend is ``engine_backend``
  tickets                     a peer draws ticket t with ``add``
  hello/<t>                   JSON {name, pid, host, proof}: ``proof`` = ``admission_proof(token, nonce, t)``
  admit/<t>                   the sender's verdict: JSON {rank} (1..N), or {error} for a refused peer
Group keys, under the secret prefix ``group_prefix(token, nonce)`` (the store cannot list keys, so
only a holder of the run's weight-sync token knows where they are):
  plane/<r>                   JSON init_info of the data plane for receiver r, written before it is
                              admitted; passed unchanged to its engine's ``init_weight_transfer_engine``
  rank/<r>                    JSON {name, pid, host} of receiver r's actor process (the helper)
  worker/<r>                  JSON {name, pid, host} of the vLLM worker process that holds rank r
  hb/<r>                      heartbeat counter bumped by the process that holds rank r's gloo group
  push/<k>                    JSON {version, info} announcing the k-th push (k = 1, 2, ...); ``info``
                              is the data plane's update_info, handed on to ``update_weights``
  progress/<k>/<r>            buckets of push k that rank r has received
  ack/<k>/<r>, nack/<k>/<r>   JSON outcome of push k on rank r (loaded version, or the error)
  abort/<k>                   set by the sender when it gives up on push k, so the surviving
                              receivers stop waiting at once instead of at their gloo timeout
Gloo data plane (``weightsync.plane.GlooPlane``): a gloo process group of ``world_size`` ranks built
over a ``PrefixStore`` of the group keys (independent of any default process group, so it coexists
with FSDP's and vLLM's own groups).
Every collective gets an explicit timeout; gloo raises when it expires (checked on this stack for a
peer killed with SIGKILL and one frozen with SIGSTOP mid-broadcast).

Who may join: the sender admits a peer only if its proof matches (HMAC-SHA256 with the run's
``RunSecrets.weight_sync_token``, bound to this sender's nonce and the peer's ticket, so a proof read
off the store is worth nothing to anyone else), and never more than N. A stranger without the token
is refused and counted; it can delay the rendezvous by writing public keys, but it cannot take a
seat, find the group keys, join the gloo group, receive weights, announce pushes or forge acks. The
bytes themselves travel unencrypted (like NCCL's): the network between the nodes must be trusted
against eavesdroppers.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import secrets
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
LOOPBACK = "127.0.0.1"  # the single-machine default address of the sender
TICKETS = "tickets"


class WeightSyncError(RuntimeError):
    """A weight push failed: a receiver died, hung past the deadline, or reported an error.
    ``failed_ranks``: receiver rank -> why; ``suspects``: the same keyed by the receiver's name (what
    the driver restarts). Both survive pickling (the error crosses Ray from the learner rank)."""

    def __init__(self, message: str, *, failed_ranks: dict[int, str] | None = None,
                 suspects: dict[str, str] | None = None):
        super().__init__(message)
        self.failed_ranks = dict(failed_ranks or {})
        self.suspects = dict(suspects or {})

    def __reduce__(self):
        return _rebuild_weight_sync_error, (str(self), self.failed_ranks, self.suspects)


def _rebuild_weight_sync_error(message: str, failed_ranks: dict, suspects: dict) -> WeightSyncError:
    return WeightSyncError(message, failed_ranks=failed_ranks, suspects=suspects)


def key_hello(ticket: int) -> str:
    return f"hello/{ticket}"


def key_admit(ticket: int) -> str:
    return f"admit/{ticket}"


def key_plane(rank: int) -> str:
    return f"plane/{rank}"


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


def new_nonce() -> str:
    return secrets.token_hex(16)


def _mac(token: str, message: str) -> str:
    return hmac.new(token.encode(), message.encode(), hashlib.sha256).hexdigest()


def admission_proof(token: str, nonce: str, ticket: int) -> str:
    """Hex HMAC-SHA256(token, "hello/<nonce>/<ticket>"): what a receiver writes into ``hello/<ticket>``."""
    return _mac(token, f"hello/{nonce}/{ticket}")


def proof_matches(token: str, nonce: str, ticket: int, claimed: object) -> bool:
    """Constant-time check of a peer's claimed proof (any type: a stranger writes what it likes)."""
    return hmac.compare_digest(str(claimed).encode(), admission_proof(token, nonce, ticket).encode())


def group_prefix(token: str, nonce: str) -> str:
    """Secret namespace of one sender's group keys: "group/" + hex HMAC-SHA256(token, "group/<nonce>")."""
    return "group/" + _mac(token, f"group/{nonce}")


def group_store(root: dist.Store, prefix: str) -> dist.PrefixStore:
    return dist.PrefixStore(prefix, root)


def join_group(host: str, port: int, token: str, name: str,
               timeout_s: float = 300.0) -> tuple[dist.PrefixStore, dict, int, str]:
    """Receiver side of the admission: draw a ticket, prove the token, wait for the sender's verdict
    (up to its ``connect_timeout_s``; the sender answers while it connects or pushes).

    Returns ``(group store, sender config, rank, group prefix)``; raises ``WeightSyncError`` when the
    sender refused this peer (wrong token, all seats taken) or never answered."""
    root = connect_store(host, port, timeout_s)
    cfg = get_json(root, "config")
    ticket = root.add(TICKETS, 1)
    set_json(root, key_hello(ticket), {**process_info(name),
                                       "proof": admission_proof(token, cfg["nonce"], ticket)})
    try:
        root.wait([key_admit(ticket)], timedelta(seconds=float(cfg["connect_timeout_s"])))
    except dist.DistStoreError as e:
        raise WeightSyncError(f"{name}: the weight-sync sender at {host}:{port} did not admit us within "
                              f"{float(cfg['connect_timeout_s']):.0f} s") from e
    verdict = get_json(root, key_admit(ticket))
    if "rank" not in verdict:
        raise WeightSyncError(f"{name}: the weight-sync sender at {host}:{port} refused us: "
                              f"{verdict.get('error', verdict)}")
    prefix = group_prefix(token, cfg["nonce"])
    return group_store(root, prefix), cfg, int(verdict["rank"]), prefix


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
    """Bumps ``hb/<rank>`` (a group key, under ``prefix``) every ``period_s`` from a daemon thread so
    the sender can tell a dead receiver (counter frozen) from a slow one. Runs in the process that
    owns the gloo rank."""

    def __init__(self, host: str, port: int, rank: int, prefix: str, period_s: float = HEARTBEAT_PERIOD_S):
        self._store = group_store(connect_store(host, port, timeout_s=30), prefix)
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
        """Stops beating and waits for the thread (an ``add`` in flight ends within the store's
        timeout): a process that exits with the thread inside the store client can abort."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=35)


def maybe_json(store: dist.Store, key: str) -> dict:
    """The JSON at ``key``; {} when absent or unreadable."""
    try:
        return get_json(store, key) if store.check([key]) else {}
    except Exception:
        return {}


def describe_receiver(store: dist.Store, rank: int) -> str:
    actor, worker = maybe_json(store, key_rank(rank)), maybe_json(store, key_worker(rank))
    return (f"rank {rank} (engine {actor.get('name', '?')!r}, actor pid {actor.get('pid', '?')}, "
            f"transfer-rank pid {worker.get('pid', '?')} on {worker.get('host', actor.get('host', '?'))})")


class HeartbeatWatch:
    """Which receivers' heartbeat counters have not moved for ``window_s`` (dead or frozen), read without
    blocking: each `stalled` call reads the counters of ``ranks`` and remembers when each last moved."""

    def __init__(self, store: dist.Store, window_s: float):
        self._store, self._window = store, window_s
        self._moved: dict[int, tuple[int, float]] = {}  # rank -> (counter, time.monotonic() it last moved)

    def stalled(self, ranks: list[int]) -> list[int]:
        now, out = time.monotonic(), []
        for r in ranks:
            beat = self._store.add(key_heartbeat(r), 0)
            if self._moved.get(r, (None,))[0] != beat:
                self._moved[r] = (beat, now)
            elif now - self._moved[r][1] >= self._window:
                out.append(r)
        return out


def stalled_heartbeats(store: dist.Store, ranks: list[int], window_s: float) -> list[int]:
    """Ranks whose heartbeat counter did not move during ``window_s`` (blocks that long)."""
    watch = HeartbeatWatch(store, window_s)
    watch.stalled(ranks)
    time.sleep(window_s)
    return watch.stalled(ranks)


def process_info(name: str) -> dict:
    return {"name": name, "pid": os.getpid(), "host": this_host()}
