"""Wire protocol shared by the learner-side sender and the actor-side receivers (torch only).

Why a separate module: the learner must not import vllm, while the receiving end lives inside a
vLLM worker. Both ends need the same store keys, the same admission and the same error, so those live
here and nothing here imports vllm. The gloo group and its bucket framing are ``weightsync.gloo_group``;
heartbeats and the abort key's probe, ``weightsync.liveness``.

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
  outcomes/<k>                counter: each receiver, after writing its ack (nack) of push k, adds 1
                              (``NACK_STEP``) to it (``post_ack``, ``post_nack``), so the sender waits
                              on this one key instead of polling every receiver's (``outcome_counts``)
  abort/<k>                   set by the sender when it gives up on push k, so the surviving
                              receivers stop waiting at once instead of at their gloo timeout
The gloo data plane's group and bucket framing: ``weightsync.gloo_group``.

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
import secrets
import socket
from datetime import timedelta

import torch.distributed as dist

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


def key_abort(seq: int) -> str:
    return f"abort/{seq}"


def key_ack(seq: int, rank: int) -> str:
    return f"ack/{seq}/{rank}"


def key_nack(seq: int, rank: int) -> str:
    return f"nack/{seq}/{rank}"


def key_outcomes(seq: int) -> str:
    return f"outcomes/{seq}"


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
