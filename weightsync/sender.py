"""Learner side of the weight sync: rank 0 of the FSDP group pushes weights to every actor engine.

Why it looks like this:
- One control plane, pluggable data planes. ``WeightSender`` owns the choreography every backend
  shares: admission, the push announcement, acks/nacks, abort keys, heartbeats, deadlines and the
  failure diagnosis (``weightsync.push_outcome``), over a TCPStore. The bytes travel through a data
  plane (``weightsync.plane``) named by ``backend`` in ``weightsync.backends``: "gloo" by default (CPU,
  CI), "nccl" on GPUs, or a plane passed in.
- The learner may not import vllm, so this module speaks only torch. The receiving end is a vLLM
  weight-transfer engine (ours: ``weightsync.gloo.engine``), driven by ``weightsync.receiver``.
- A push is split in two so the learner need not idle while weights travel:
  ``prepare(named, version)`` consumes the iterable on the caller's thread (that iteration is the FSDP
  gather, a collective of every rank) and encodes it (dense, or a delta against what the receivers
  hold: ``weightsync.delta``); ``send(payload)`` announces it, broadcasts it and waits for every
  acknowledgement, touching only the store and the data plane (never the default process group), so
  it may run on a background thread while the caller's thread runs FSDP collectives. Payloads must
  be sent in the order they were prepared, each once (deltas build on each other).
  ``push = send(prepare(...))``.
- Every step has a deadline; a dead or frozen actor makes ``send`` raise ``WeightSyncError`` naming
  it, never hang. After a failure the sender is unusable: make a new ``WeightSender`` (and have the
  survivors re-init); its first push is dense.
- ``send`` returns only after every receiver acknowledged the version its engine now reports, so the
  learner knows exactly which version each engine holds.
- Only peers that prove the run's weight-sync token are admitted (``weightsync.protocol``: who may
  join); the others are refused and counted in ``refused`` (reported by every push).

Usage (learner, all FSDP ranks iterate the gather; only rank 0 owns a sender)::

    sender = WeightSender(num_receivers=len(actors), host=my_ip, port=0, token=secrets.weight_sync_token,
                          mode="delta", full_every=10)
    ... hand sender.address and the token to the actors, they call WeightReceiver.init() ...
    payload = sender.prepare(learner.named_full_weights(dtype), version=step)   # rank 0
    stats = sender.send(payload)                                                # rank 0, any thread
    drain(learner.named_full_weights(dtype))                                    # other ranks
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator

import torch

from weightsync import backends
from weightsync.delta import DeltaEncoder, int32_patch_nbytes
from weightsync.plane import DEFAULT_MIN_GBPS, Payload, PlaneContext, SenderPlane
from weightsync.protocol import (
    LOOPBACK,
    TICKETS,
    WeightSyncError,
    describe_receiver,
    get_json,
    group_handle,
    group_prefix,
    group_store,
    key_abort,
    key_admit,
    key_hello,
    key_plane,
    key_push,
    key_rank,
    key_unformed,
    key_worker,
    maybe_json,
    new_nonce,
    proof_matches,
    serve_store,
    set_json,
    signed_root,
)
from weightsync.push_outcome import name_suspects, wait_acks
from weightsync.signing import Forgeries, group_key, open_value
from weightsync.staging import StagingArea

logger = logging.getLogger(__name__)

_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "module.")


def clean_param_name(name: str) -> str:
    """HF name of a parameter, without the prefixes torch.compile / checkpoint wrappers insert."""
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


def full_named_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every parameter, each a new tensor (a payload keeps it).
    FSDP2 ``DTensor`` shards are all-gathered with ``full_tensor()`` (a collective: every FSDP rank
    must iterate this in the same order). The learner's own gatherer is ``learner.gather``."""
    for name, p in module.named_parameters():
        full = p.full_tensor() if callable(getattr(p, "full_tensor", None)) else p.detach().clone()
        yield clean_param_name(name), full.detach()


def drain(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Non-sender FSDP ranks call this to take part in the gathers of a push."""
    for _ in named_tensors:
        pass


def wire_dtype(dtype: torch.dtype, cast_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a tensor of ``dtype`` travels in: floating ones cast to ``cast_dtype`` when given."""
    return cast_dtype if cast_dtype is not None and dtype.is_floating_point else dtype


def wire_tensor(t: torch.Tensor, cast_dtype: torch.dtype | None) -> torch.Tensor:
    """``t`` as it travels (``wire_dtype``)."""
    return t.detach().to(wire_dtype(t.dtype, cast_dtype))


class WeightSender:
    """Pushes weights to ``num_receivers`` vLLM engines: the control plane, over its TCPStore, plus a
    data plane (``plane``; default: a ``GlooPlane`` rooted here).

    ``host`` is the address receivers connect to and the one the gloo plane binds
    (``GLOO_SOCKET_IFNAME`` overrides the latter): this node's IP on a cluster, loopback (the
    default) on a single machine; the store listens on that address only. Whoever reaches it can still
    read and write it, which is why ``token`` (the run's ``RunSecrets.weight_sync_token``) must be
    proven by every peer before it gets a seat, and every value is signed with a key derived from it
    (``weightsync.signing``: forged values are refused and counted in ``forged``). ``port=0`` picks a
    free port (read it back from ``address``).
    ``backend``: the data plane when ``plane`` is not given, by its name in ``weightsync.backends``:
    "gloo" (``GlooPlane``) or "nccl" (``weightsync.nccl.plane.NcclPlane`` over engines of ``tp`` workers
    each, TP × PP).
    ``timeout_s`` is the deadline of the broadcast (per bucket on the gloo plane) and of the
    acknowledgements. ``cast_dtype``: floating tensors are cast to it in ``prepare`` (None: sent as
    given; the learner's gatherer already yields the serving dtype). ``mode``: "full" (every push
    dense) or "delta" (``weightsync.delta``: changed elements only, dense every ``full_every`` pushes
    and on the first, and whenever the delta would not be smaller; costs one copy of the weights in
    the wire dtype on this rank, in host memory, and on each gloo receiver). ``timeout_s`` also bounds
    a whole NCCL push, plus its bytes / ``min_gbps`` (GB/s: 10^9 bytes a second). ``staging``: the
    host memory pushes are staged in (``weightsync.staging``; a replaced sender's ``staging_handover()``
    keeps what it allocated); ``reserve_staging`` allocates it before the first push.
    """

    def __init__(
        self,
        num_receivers: int,
        host: str = LOOPBACK,
        port: int = 0,
        *,
        token: str,
        bucket_mb: float = 256.0,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 300.0,
        cast_dtype: torch.dtype | None = None,
        plane: SenderPlane | None = None,
        backend: str = "gloo",
        tp: int = 1,
        mode: str = "full",
        full_every: int = 10,
        min_gbps: float = DEFAULT_MIN_GBPS,
        staging: StagingArea | None = None,
    ):
        if num_receivers < 1:
            raise ValueError(f"num_receivers must be >= 1, got {num_receivers}")
        if not token:
            raise ValueError("WeightSender needs the run's weight-sync token (RunSecrets.weight_sync_token)")
        self.num_receivers = num_receivers
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.cast_dtype = cast_dtype
        self._delta = DeltaEncoder(mode, full_every)
        self._raw = serve_store(host, port, connect_timeout_s)
        self.address = (host, self._raw.port)
        self._token, self._nonce = token, new_nonce()
        self._forgeries = Forgeries()  # values refused on either store: written by no run member
        self._root = signed_root(self._raw, token, self._nonce, self._forgeries)
        self._key = group_key(token, self._nonce)
        prefix = group_prefix(token, self._nonce)
        self._store = group_store(self._raw, group_handle(prefix, self._key), self._forgeries)
        bucket_bytes = max(1, int(bucket_mb * (1 << 20)))
        if plane is None:  # an unknown name raises before anything is built on it
            plane = backends.plane_class(backend).for_sender(PlaneContext(
                self._store, host, self._raw.port, prefix, num_receivers, tp, bucket_bytes=bucket_bytes,
                timeout_s=self.timeout_s, connect_timeout_s=self.connect_timeout_s, mirror=mode == "delta",
                min_gbps=min_gbps))
        self.plane: SenderPlane = plane
        self._delta.patch_cost = getattr(plane, "patch_cost", int32_patch_nbytes)  # its dense fallback
        # host memory of the pushes, reused once a push was sent (a predecessor's: ``staging_handover``)
        self._staging = staging or StagingArea()
        set_json(self._root, "config", {"world_size": num_receivers + 1, "timeout_s": self.timeout_s,
                                        "connect_timeout_s": self.connect_timeout_s, "nonce": self._nonce,
                                        "backend": self.plane.backend,
                                        "engine_backend": self.plane.engine_backend})
        logger.info("weight sync at %s:%d: %s data plane, mode %s", *self.address, self.plane.backend, mode)
        self._lock = threading.Lock()  # admission state: _screen runs on the caller's and the send thread
        self._tickets = 0  # tickets drawn so far
        self._unanswered: set[int] = set()  # drawn, hello not answered yet
        self._seated = 0  # receivers admitted (they hold ranks 1.._seated)
        self.refused = 0  # peers refused a seat (wrong token, or none left)
        self._connected = False
        self._prepared = 0  # payloads prepared (their seq)
        self._seq = 0  # payloads sent
        self._broken: str | None = None
        self.receivers: dict[int, dict] = {}
        self.versions: dict[str, int] = {}  # engine name -> version it acknowledged

    # ------------------------------------------------------------------ rendezvous
    def registered(self) -> list[int]:
        """Receiver ranks admitted so far (answers pending hellos first; for progress reports)."""
        self._screen()
        return list(range(1, self._seated + 1))

    def _screen(self) -> None:
        """Answer every pending hello: a peer whose proof matches the token gets the next rank (and its
        data-plane init_info) while seats are left and the group is not formed yet; any other is refused
        with the reason (``refused`` counts them) and never learns where the group keys are."""
        with self._lock:
            drawn = self._raw.add(TICKETS, 0)
            self._unanswered.update(range(self._tickets + 1, drawn + 1))
            self._tickets = max(self._tickets, drawn)
            for t in sorted(self._unanswered):
                if not self._raw.check([key_hello(t)]):
                    continue  # drew a ticket, has not said hello yet
                self._unanswered.discard(t)
                try:  # a hello not signed with the group key is a stranger's (a refused peer)
                    hello = json.loads(open_value(self._key, "root", key_hello(t), self._raw.get(key_hello(t))))
                    proven = proof_matches(self._token, self._nonce, t, hello.get("proof"))
                except (TypeError, ValueError, AttributeError):  # not signed, not JSON, not an object
                    hello, proven = {}, False
                if not proven:
                    why = "wrong weight-sync token"
                elif self._connected or self._seated == self.num_receivers:
                    why = f"all {self.num_receivers} receiver seats are taken"
                else:
                    self._seated += 1
                    set_json(self._store, key_plane(self._seated), self.plane.init_info(self._seated))
                    set_json(self._root, key_admit(t), {"rank": self._seated})
                    continue
                self.refused += 1
                logger.warning("weight sync at %s:%d refused a peer (claims to be %r on %r): %s", *self.address,
                               hello.get("name"), hello.get("host"), why)
                set_json(self._root, key_admit(t), {"error": why})

    def connect(self) -> None:
        """Wait for every receiver to register and join the data plane (``connect_timeout_s``)."""
        if self._connected:
            return
        ranks = list(range(1, self.num_receivers + 1))
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            missing = sorted(set(ranks) - set(self.registered()))
            if not missing:
                break
            if self._broken:  # closed from another thread (the driver rebuilds the group)
                raise self._give_up(WeightSyncError(f"weight-sync group abandoned before it formed: {self._broken}"))
            if time.monotonic() > deadline:
                raise self._give_up(WeightSyncError(
                    f"only {self.num_receivers - len(missing)} of {self.num_receivers} receivers registered "
                    f"at {self.address} within {self.connect_timeout_s:.0f} s; missing ranks {missing}",
                    failed_ranks={r: "never registered" for r in missing},
                ))
            time.sleep(0.05)
        try:
            self.plane.connect(max(1.0, deadline - time.monotonic()))
        except RuntimeError as e:
            raise self._give_up(WeightSyncError(f"{self.plane.backend} rendezvous with {self.num_receivers} "
                                                f"receivers failed: {e}")) from e
        self._connected = True
        # worker/<r> is written by our gloo engine only (another plane's engine may not say who it is)
        self.receivers = {r: {**get_json(self._store, key_rank(r)), "worker": maybe_json(self._store, key_worker(r))}
                          for r in ranks}

    # ------------------------------------------------------------------ push
    def reserve_staging(self, tensors: Iterable[tuple[str, torch.Size, torch.dtype]], device: torch.device) -> int:
        """Allocate now the page-locked host memory that pushes of ``tensors`` ((name, shape, dtype) each, as
        ``prepare`` will be given them, on ``device``) are staged in, so that the first push only copies:
        locking 15.2 GB (a 7B model in bf16; 30.5 GB in delta mode) takes seconds, which the first push
        would spend between two training steps. Returns the bytes held (0 for host tensors: never staged)."""
        if self._staging.ops.on_host(torch.empty(0, device=device)):
            return 0
        sizes = [(name, math.prod(shape) * wire_dtype(dtype, self.cast_dtype).itemsize) for name, shape, dtype in tensors]
        return self._staging.reserve(sizes, delta=self._delta.mode == "delta")

    def staging_handover(self) -> StagingArea:
        """This sender's staging memory for the sender that replaces it (``StagingArea.handed_over``)."""
        return self._staging.handed_over()

    def prepare(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> Payload:
        """Consume ``named_tensors`` on this thread (the FSDP gather) and encode push ``version``: dense,
        or the patches against what every receiver holds (``weightsync.delta``). The tensors must be
        new (not views of live parameters): the payload keeps them, and in delta mode they become the
        baseline of the next push. What the payload and the baseline keep of a GPU tensor is staged in
        pinned host memory as it arrives (``weightsync.staging``: nothing of a push stays on the GPU
        through the next training step; CPU tensors are kept as they are). That memory is reused: the
        payload's host tensors are valid until the next ``prepare`` after it was sent. An error raised
        by the iterable propagates; nothing was announced and the sender stays usable (its next push
        is dense)."""
        stager = self._staging.stager(self._prepared + 1)
        named = ((name, wire_tensor(t, self.cast_dtype)) for name, t in named_tensors)
        payload = self._delta.encode(named, int(version), self._prepared + 1, stager=stager)
        payload.ready = stager.done()
        self._prepared += 1
        return payload

    def send(self, payload: Payload) -> dict:
        """Announce ``payload``, broadcast it and wait until every engine has loaded it.

        Returns ``{version, seq, mode, backend, bytes, changed_frac, buckets, tensors, seconds, send_s,
        ack_s, gbps, acks, ack_info, refused, refused_peers, forged}`` where ``bytes`` counts the payload
        bytes on the wire, ``changed_frac`` the changed elements / all elements (1.0 when dense), ``acks`` maps engine name
        -> the version that engine reports after loading, ``ack_info`` holds each receiver's full
        acknowledgement (its load time etc), ``refused_peers`` counts the peers this sender refused so far
        (answered before every push), ``forged`` the distinct forged store values it refused (written by
        no run member), and ``refused`` both. Raises ``WeightSyncError`` (naming the failed engines) on a
        dead/frozen/failing receiver, and ``ValueError`` for a payload sent out of order.
        """
        if self._broken:
            raise WeightSyncError(f"sender unusable after an earlier failure: {self._broken}")
        if payload.seq != self._seq + 1:
            raise ValueError(f"payload #{payload.seq} sent after #{self._seq}: send every prepared payload "
                             "once, in the order prepared (deltas build on each other)")
        self.connect()
        self._screen()
        self._seq = seq = payload.seq
        version = payload.version
        t0 = time.perf_counter()
        try:
            set_json(self._store, key_push(seq), {"version": version, "info": self.plane.update_info(payload)})
            stats = self.plane.send(payload, self.timeout_s)
            self._staging.release(seq)  # the plane has read the payload: its memory serves the next one
            t_sent = time.perf_counter()
            acks = wait_acks(self._store, self.receivers, seq, version, self.timeout_s, lambda: self._broken)
        except WeightSyncError as e:
            raise self._fail(seq, e) from e
        except Exception as e:
            raise self._fail(seq, WeightSyncError(f"push of version {version} aborted: {e!r}")) from e
        except BaseException:  # KeyboardInterrupt etc: poison the sender, let it through
            self._broken = "interrupted during a push"
            self.plane.abort()
            raise
        t1 = time.perf_counter()
        for a in acks.values():
            self.versions[a["name"]] = version
        return {
            "version": version,
            "seq": seq,
            "mode": payload.mode,
            "backend": self.plane.backend,
            "changed_frac": payload.changed_frac,
            **stats,
            "seconds": t1 - t0,
            "send_s": t_sent - t0,
            "ack_s": t1 - t_sent,
            "gbps": stats["bytes"] / max(t1 - t0, 1e-9) / 1e9,
            "acks": {a["name"]: a["version"] for a in acks.values()},
            "ack_info": {a["name"]: a for a in acks.values()},
            "refused": self.refused + self.forged,
            "refused_peers": self.refused,
            "forged": self.forged,
        }

    @property
    def forged(self) -> int:
        """Distinct store values this sender refused as forged (not signed by a run member)."""
        return self._forgeries.count

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        """``send(prepare(named_tensors, version))``."""
        return self.send(self.prepare(named_tensors, version))

    def _fail(self, seq: int, err: WeightSyncError) -> WeightSyncError:
        """Name the receivers responsible, poison the sender; returns the error to raise."""
        sent = getattr(self.plane, "buckets_sent", None)  # planes that count buckets (gloo's progress keys)
        with contextlib.suppress(Exception):  # tell the survivors to stop waiting for this push
            self._store.set(key_abort(seq), str(err)[:2000])
        failed = name_suspects(self._store, list(self.receivers), seq, err.failed_ranks, sent)
        who = "; ".join(f"{describe_receiver(self._store, r)}: {why}" for r, why in sorted(failed.items())
                        if r > 0) or "no receiver identified"
        msg = f"weight push #{seq} failed: {err}. Suspect receivers: {who}"
        self._broken = msg
        self.plane.abort()
        suspects = {self.receivers[r].get("name", str(r)): why for r, why in failed.items() if r in self.receivers}
        return WeightSyncError(msg, failed_ranks=failed, suspects=suspects)

    def _give_up(self, err: WeightSyncError) -> WeightSyncError:
        """The group will not form: say why under ``unformed`` (receivers still in the data plane's rendezvous
        leave it at once: ``liveness.unformed_probe``); returns ``err``."""
        with contextlib.suppress(Exception):  # best effort: a receiver's own deadline still ends its wait
            self._store.set(key_unformed(), str(err)[:2000])
        return err

    def close(self) -> None:
        if not self._connected:
            self._give_up(WeightSyncError("the sender was closed before its group formed"))
        self.plane.abort()
        self._broken = self._broken or "closed"

