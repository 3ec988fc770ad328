"""Wire protocol shared by the learner-side sender and the actor-side receivers (no vLLM: torch, and
`cryptography` through `weightsync.signing`).

Why a separate module: the learner must not import vllm, while the receiving end lives inside a
vLLM worker. Both ends need the same store keys, the same admission and the same error, so those live
here and nothing here imports vllm. The gloo group and its bucket framing are ``weightsync.gloo.group``;
heartbeats and the abort key's probe, ``weightsync.liveness``.

Control plane: a ``torch.distributed.TCPStore`` hosted by the sender at ``(host, port)``, listening on
that address only (``serve_store``: loopback on one machine, the node's cluster address on a cluster).
A TCPStore has no access control: whoever reaches the port may list every key (``list_keys``), read
every value and write any key. So nothing here relies on a key being hard to find: every value a run
member writes carries a tag of the group's key (``weightsync.signing``; the key is derived from the
run's ``RunSecrets.weight_sync_token`` and the sender's nonce, and appears nowhere on the store), every
value it reads must carry a valid one (a forged value is as good as absent, and counted), and the
group's values are encrypted too.
Root keys (signed, readable by anyone):
  config                      JSON {world_size, timeout_s, connect_timeout_s, nonce, backend,
                              engine_backend}: the sender's settings, which every receiver adopts
                              (world_size counts the sender as rank 0); ``nonce`` is fresh for every
                              sender; ``backend`` names its data plane (``weightsync.plane``), whose
                              vLLM engine backend is ``engine_backend``
  tickets                     a peer draws ticket t with ``add`` (a counter: unsigned)
  hello/<t>                   JSON {name, pid, host, proof}: ``proof`` = ``admission_proof(token, nonce, t)``
  admit/<t>                   the sender's verdict: JSON {rank} (1..N), or {error} for a refused peer
Group keys, under the public prefix ``group_prefix(token, nonce)`` (signed and sealed):
  plane/<r>                   JSON init_info of the data plane for receiver r, written before it is
                              admitted; passed to its engine's ``init_weight_transfer_engine`` with
                              ``prefix`` replaced by the group's handle (``SignedStore.handle``)
  rank/<r>                    JSON {name, pid, host} of receiver r's actor process (the helper)
  worker/<r>                  JSON {name, pid, host} of the vLLM worker process that holds rank r
  hb/<r>                      heartbeat counter bumped by the process that holds rank r's gloo group
  push/<k>                    JSON {version, info} announcing the k-th push (k = 1, 2, ...); ``info``
                              is the data plane's update_info, handed on to ``update_weights``
  progress/<k>/<r>            buckets of push k that rank r has received (a counter)
  joined/<k>/<r>              workers of rank r that entered push k's transfer (a counter; NCCL plane:
                              ``push_outcome.push_failure_probe`` names a rank that never does)
  ack/<k>/<r>, nack/<k>/<r>   JSON outcome of push k on rank r (loaded version, or the error)
  outcomes/<k>                counter: each receiver, after writing its ack (nack) of push k, adds 1
                              (``NACK_STEP``) to it (``post_ack``, ``post_nack``), so the sender waits
                              on this one key instead of polling every receiver's (``outcome_counts``)
  abort/<k>                   set by the sender when it gives up on push k, so the surviving
                              receivers stop waiting at once instead of at their gloo timeout
  unformed                    set by the sender (its reason) when it gives up on forming the group
                              (its ``connect`` failed, or it was closed first): a worker still in the
                              data plane's rendezvous (``weightsync.nccl.engine``) leaves it at once
                              instead of holding its engine core for ``connect_timeout_s``
  weightsync/gloo/...         the gloo group's own rendezvous keys (``weightsync.gloo.group``)

Who may join: the sender admits a peer only if its proof matches (HMAC-SHA256 with the run's
``RunSecrets.weight_sync_token``, bound to this sender's nonce and the peer's ticket, so a proof read
off the store is worth nothing to anyone else), and never more than N. A stranger without the token
is refused and counted; it can delay the rendezvous or a push by overwriting keys or bumping counters
(a denial of service, which is why the store listens on loopback or the cluster network only), but it
cannot take a seat, read the group's values, join the gloo group, receive weights, announce pushes,
forge acks or aborts. The bytes of the data plane travel unencrypted and unauthenticated (like
NCCL's): the network between the nodes must be trusted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from datetime import timedelta

import torch.distributed as dist

from weightsync.signing import Forgeries, SignedStore, group_key, open_value

ABORTED_BY_SENDER = "sender aborted the push"  # receivers' error text when the sender gave up first
LOOPBACK = "127.0.0.1"  # the single-machine default address of the sender
TICKETS = "tickets"
NACK_STEP = 1 << 20  # a nack adds this to outcomes/<k>, an ack 1 (a group has far fewer than 2^20 receivers)


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


def key_joined(seq: int, rank: int) -> str:
    return f"joined/{seq}/{rank}"


def key_abort(seq: int) -> str:
    return f"abort/{seq}"


def key_ack(seq: int, rank: int) -> str:
    return f"ack/{seq}/{rank}"


def key_nack(seq: int, rank: int) -> str:
    return f"nack/{seq}/{rank}"


def key_outcomes(seq: int) -> str:
    return f"outcomes/{seq}"


def key_unformed() -> str:
    return "unformed"


def post_ack(store: dist.Store, seq: int, rank: int, ack: dict) -> None:
    """Receiver ``rank`` acknowledges push ``seq``: its ack, then the outcome counter (in that order:
    a counted outcome is always readable)."""
    set_json(store, key_ack(seq, rank), ack)
    store.add(key_outcomes(seq), 1)


def post_nack(store: dist.Store, seq: int, rank: int, error: str) -> None:
    """Receiver ``rank`` reports that push ``seq`` failed on it (``error``, cut to 2000 characters)."""
    set_json(store, key_nack(seq, rank), {"error": error[:2000]})
    store.add(key_outcomes(seq), NACK_STEP)


def outcome_counts(store: dist.Store, seq: int) -> tuple[int, int]:
    """``(acks, nacks)`` posted for push ``seq`` so far: one store round trip."""
    nacks, acks = divmod(store.add(key_outcomes(seq), 0), NACK_STEP)
    return acks, nacks


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """Client connection to the sender's store (raises after ``timeout_s`` if nobody listens)."""
    return dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s))


def listen_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to ``host`` only (loopback on one machine, the node's cluster address on a
    cluster), listening; ``port`` 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


def serve_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A TCPStore server listening on ``host`` only: torch's own server binds every interface, so it
    is handed a socket bound here (``master_listen_fd``; the store owns the descriptor from then on)."""
    sock = listen_socket(host, port)
    bound = sock.getsockname()[1]
    return dist.TCPStore(host, bound, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                         master_listen_fd=sock.detach())


def signed_root(root: dist.Store, token: str, nonce: str, forgeries: Forgeries | None = None) -> SignedStore:
    """The root keys (config, hello, admit) of the sender with ``nonce``, signed with its group key."""
    return SignedStore(root, group_key(token, nonce), "root", forgeries=forgeries)


def signed_body(blob: bytes) -> dict:
    """The JSON object inside a signed value, *unchecked* ({} when there is none): for what a peer may
    read before it can check it (the nonce of ``config``) or need not trust (a refusal)."""
    try:
        value = json.loads(blob.split(b":", 2)[2].decode()) if blob.startswith(b"ws1:") else {}
    except (ValueError, IndexError):
        return {}
    return value if isinstance(value, dict) else {}


def read_config(root: dist.Store, token: str) -> dict:
    """The sender's ``config``, checked: signed with the group key of the nonce it names (a forged or
    rewritten config raises ``WeightSyncError``)."""
    blob = root.get("config")
    nonce = str(signed_body(blob).get("nonce", ""))
    value = open_value(group_key(token, nonce), "root", "config", blob) if nonce else None
    if value is None:
        raise WeightSyncError("the weight-sync store's config is not signed by this run (forged or rewritten)")
    return json.loads(value.decode())


def _await_verdict(raw: dist.Store, root: SignedStore, ticket: int, timeout_s: float) -> dict:
    """The sender's verdict on ``ticket``: a signed one; an unsigned refusal is taken at its word (a
    peer with the wrong token cannot check the sender's answer, and a forged refusal only delays a
    member, as overwriting any key would); an unsigned seat is ignored. ``DistStoreError`` on timeout."""
    key = key_admit(ticket)
    deadline = time.monotonic() + timeout_s
    raw.wait([key], timedelta(seconds=timeout_s))
    while True:
        if root.check([key]):
            return get_json(root, key)
        unchecked = signed_body(raw.get(key))
        if "error" in unchecked and "rank" not in unchecked:
            return unchecked
        if time.monotonic() > deadline:
            raise dist.DistStoreError(f"no signed verdict at {key} within {timeout_s:.0f} s")
        time.sleep(0.05)


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
    """Namespace of one sender's group keys: "group/" + hex HMAC-SHA256(token, "group/<nonce>"). Public
    (anyone may list the store's keys): it separates groups, it guards nothing."""
    return "group/" + _mac(token, f"group/{nonce}")


HANDLE_SEP = "|"


def group_handle(prefix: str, key: bytes) -> str:
    """What a member process needs to open the group (``group_store``): its prefix and its key. Passed
    as a process argument only (the receiver puts it into its engine's init_info), never stored."""
    return f"{prefix}{HANDLE_SEP}{key.hex()}"


def group_store(root: dist.Store, handle: str, forgeries: Forgeries | None = None) -> dist.Store:
    """The group's keys on ``root``: signed and sealed with the group key when ``handle`` is a
    ``group_handle``; a plain prefix (tests) gives an unsigned ``PrefixStore``."""
    prefix, sep, key_hex = handle.partition(HANDLE_SEP)
    inner = dist.PrefixStore(prefix, root)
    if not sep:
        return inner
    return SignedStore(inner, bytes.fromhex(key_hex), prefix, seal=True, forgeries=forgeries, handle=handle)


def join_group(host: str, port: int, token: str, name: str,
               timeout_s: float = 300.0) -> tuple[dist.Store, dict, int, str]:
    """Receiver side of the admission: draw a ticket, prove the token, wait for the sender's verdict
    (up to its ``connect_timeout_s``; the sender answers while it connects or pushes).

    Returns ``(group store, sender config, rank, group handle)``; raises ``WeightSyncError`` when the
    sender refused this peer (wrong token, all seats taken), never answered, or its config or verdict
    is not signed by the run. The handle (``group_handle``) opens the same group in another process."""
    raw = connect_store(host, port, timeout_s)
    cfg = signed_body(raw.get("config"))  # checked below, once admitted: a wrong token is refused by the sender
    root = signed_root(raw, token, str(cfg.get("nonce", "")))
    ticket = raw.add(TICKETS, 1)
    set_json(root, key_hello(ticket), {**process_info(name),
                                       "proof": admission_proof(token, str(cfg.get("nonce", "")), ticket)})
    wait_s = float(cfg.get("connect_timeout_s", timeout_s))
    try:
        verdict = _await_verdict(raw, root, ticket, wait_s)
    except dist.DistStoreError as e:
        raise WeightSyncError(f"{name}: the weight-sync sender at {host}:{port} did not admit us within "
                              f"{wait_s:.0f} s") from e
    if "rank" not in verdict:
        raise WeightSyncError(f"{name}: the weight-sync sender at {host}:{port} refused us: "
                              f"{verdict.get('error', verdict)}")
    if read_config(raw, token) != cfg:  # a seat signed with our key: the config must be signed too
        raise WeightSyncError(f"{name}: the weight-sync store at {host}:{port} holds a config not signed by this run")
    handle = group_handle(group_prefix(token, cfg["nonce"]), group_key(token, cfg["nonce"]))
    return group_store(raw, handle), cfg, int(verdict["rank"]), handle


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


def process_info(name: str) -> dict:
    return {"name": name, "pid": os.getpid(), "host": this_host()}
