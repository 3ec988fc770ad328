"""Learner side of the weight sync: rank 0 of the FSDP group pushes full weights to every actor engine.

Why it looks like this:
- The learner may not import vllm, so this module speaks only torch (TCPStore + gloo) and the
  framing in ``weightsync.packing``/``weightsync.protocol``. The receiving end is our vLLM
  weight-transfer engine (``weightsync.gloo_engine``), driven by ``weightsync.receiver``.
- Tensors are packed into large per-dtype buckets; packing bucket i+1 overlaps the broadcast of
  bucket i (a sender thread owns the gloo group, the caller's thread gathers and packs, so FSDP's own
  collectives stay on the caller's thread).
- Every collective has a deadline (gloo's own timeout, backed by a watchdog in the caller's thread);
  a dead or frozen actor makes ``push`` raise ``WeightSyncError`` naming it, never hang. After a
  failure the group is unusable: make a new ``WeightSender`` (and have the survivors re-init).
- ``push`` returns only after every receiver acknowledged the version its engine now reports, so the
  learner knows exactly which version each engine holds.
- Only peers that prove the run's weight-sync token are admitted (``weightsync.protocol``: who may
  join); the others are refused and counted in ``refused`` (reported by every push).

Usage (learner, all FSDP ranks iterate the gather; only rank 0 owns a sender)::

    sender = WeightSender(num_receivers=len(actors), host=my_ip, port=0, token=secrets.weight_sync_token)
    ... hand sender.address and the token to the actors, they call WeightReceiver.init() ...
    stats = sender.push(full_named_tensors(model), version=step)           # rank 0
    drain(full_named_tensors(model))                                       # other ranks
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from weightsync.packing import Bucket, pack_buckets
from weightsync.protocol import (
    ABORTED_BY_SENDER,
    HEARTBEAT_PERIOD_S,
    LOOPBACK,
    TICKETS,
    WeightSyncError,
    describe_receiver,
    get_json,
    group_prefix,
    group_store,
    key_abort,
    key_ack,
    key_admit,
    key_hello,
    key_nack,
    key_progress,
    key_push,
    key_rank,
    key_worker,
    new_gloo_group,
    new_nonce,
    proof_matches,
    send_bucket,
    set_json,
    stalled_heartbeats,
)

logger = logging.getLogger(__name__)

_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "module.")


def clean_param_name(name: str) -> str:
    """HF name of a parameter, without the prefixes torch.compile / checkpoint wrappers insert."""
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


def full_named_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every parameter. FSDP2 ``DTensor`` shards are all-gathered
    with ``full_tensor()`` (a collective: every FSDP rank must iterate this in the same order)."""
    for name, p in module.named_parameters():
        full = p.full_tensor() if callable(getattr(p, "full_tensor", None)) else p
        yield clean_param_name(name), full.detach()


def drain(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Non-sender FSDP ranks call this to take part in the gathers of a push."""
    for _ in named_tensors:
        pass


class WeightSender:
    """Broadcasts weights to ``num_receivers`` vLLM engines over a gloo group rooted here (rank 0).

    ``host`` is the address receivers connect to and the one this end of the gloo group binds
    (``GLOO_SOCKET_IFNAME`` overrides the latter): this node's IP on a cluster, loopback (the
    default) on a single machine. The store itself listens on every interface, whatever ``host`` is,
    which is why ``token`` (the run's ``RunSecrets.weight_sync_token``) must be proven by every peer
    before it gets a seat. ``port=0`` picks a free port (read it back from ``address``).
    ``timeout_s`` is the deadline of every
    collective and of the acknowledgements; it must also exceed the longest pause between two
    buckets (e.g. the FSDP gather of one bucket's worth of parameters), since receivers wait in a
    collective meanwhile.
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
    ):
        if num_receivers < 1:
            raise ValueError(f"num_receivers must be >= 1, got {num_receivers}")
        if not token:
            raise ValueError("WeightSender needs the run's weight-sync token (RunSecrets.weight_sync_token)")
        self.num_receivers = num_receivers
        self.bucket_bytes = max(1, int(bucket_mb * (1 << 20)))
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.cast_dtype = cast_dtype
        self._root = dist.TCPStore(host, port, None, True, timeout=timedelta(seconds=connect_timeout_s),
                                   wait_for_workers=False)
        self.address = (host, self._root.port)
        self._token, self._nonce = token, new_nonce()
        self._store = group_store(self._root, group_prefix(token, self._nonce))
        set_json(self._root, "config", {"world_size": num_receivers + 1, "timeout_s": self.timeout_s,
                                        "connect_timeout_s": self.connect_timeout_s, "nonce": self._nonce})
        self._tickets = 0  # tickets drawn so far
        self._unanswered: set[int] = set()  # drawn, hello not answered yet
        self._seated = 0  # receivers admitted (they hold ranks 1.._seated)
        self.refused = 0  # peers refused a seat (wrong token, or none left)
        self._pg: dist.ProcessGroupGloo | None = None
        self._seq = 0
        self._sent = 0
        self._broken: str | None = None
        self.receivers: dict[int, dict] = {}
        self.versions: dict[str, int] = {}  # engine name -> version it acknowledged

    # ------------------------------------------------------------------ rendezvous
    def registered(self) -> list[int]:
        """Receiver ranks admitted so far (answers pending hellos first; for progress reports)."""
        self._screen()
        return list(range(1, self._seated + 1))

    def _screen(self) -> None:
        """Answer every pending hello: a peer whose proof matches the token gets the next rank while
        seats are left and the group is not formed yet; any other is refused with the reason
        (``refused`` counts them) and never learns where the group keys are."""
        drawn = self._root.add(TICKETS, 0)
        self._unanswered.update(range(self._tickets + 1, drawn + 1))
        self._tickets = max(self._tickets, drawn)
        for t in sorted(self._unanswered):
            if not self._root.check([key_hello(t)]):
                continue  # drew a ticket, has not said hello yet
            self._unanswered.discard(t)
            try:
                hello = get_json(self._root, key_hello(t))
                proven = proof_matches(self._token, self._nonce, t, hello.get("proof"))
            except (ValueError, AttributeError):  # not JSON, or not an object
                hello, proven = {}, False
            if not proven:
                why = "wrong weight-sync token"
            elif self._pg is not None or self._seated == self.num_receivers:
                why = f"all {self.num_receivers} receiver seats are taken"
            else:
                self._seated += 1
                set_json(self._root, key_admit(t), {"rank": self._seated})
                continue
            self.refused += 1
            logger.warning("weight sync at %s:%d refused a peer (claims to be %r on %r): %s", *self.address,
                           hello.get("name"), hello.get("host"), why)
            set_json(self._root, key_admit(t), {"error": why})

    def connect(self) -> None:
        """Wait for every receiver to register and join the gloo group (``connect_timeout_s``)."""
        if self._pg is not None:
            return
        ranks = list(range(1, self.num_receivers + 1))
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            missing = sorted(set(ranks) - set(self.registered()))
            if not missing:
                break
            if time.monotonic() > deadline:
                raise WeightSyncError(
                    f"only {self.num_receivers - len(missing)} of {self.num_receivers} receivers registered "
                    f"at {self.address} within {self.connect_timeout_s:.0f} s; missing ranks {missing}",
                    failed_ranks={r: "never registered" for r in missing},
                )
            time.sleep(0.05)
        try:
            self._pg = new_gloo_group(self._store, 0, self.num_receivers + 1, self.timeout_s,
                                      local_host=self.address[0],
                                      connect_timeout_s=max(1.0, deadline - time.monotonic()))
        except RuntimeError as e:
            raise WeightSyncError(f"gloo rendezvous with {self.num_receivers} receivers failed: {e}") from e
        self.receivers = {r: {**get_json(self._store, key_rank(r)),
                              "worker": get_json(self._store, key_worker(r))} for r in ranks}

    # ------------------------------------------------------------------ push
    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        """Send one full set of weights tagged ``version`` and wait until every engine has loaded it.

        Returns ``{version, seq, bytes, buckets, tensors, seconds, send_s, ack_s, gbps, acks, ack_info,
        refused}`` where ``acks`` maps engine name -> the version that engine reports after loading,
        ``ack_info`` holds each receiver's full acknowledgement (its load time etc) and ``refused``
        counts the peers this sender refused so far (answered before every push). Raises
        ``WeightSyncError`` (naming the failed engines) on a dead/frozen/failing receiver.
        """
        if self._broken:
            raise WeightSyncError(f"sender unusable after an earlier failure: {self._broken}")
        self.connect()
        assert self._pg is not None
        self._screen()
        self._seq += 1
        seq = self._seq
        t0 = time.perf_counter()
        set_json(self._store, key_push(seq), {"version": int(version)})
        stats = {"bytes": 0, "buckets": 0, "tensors": 0}
        self._sent = 0  # buckets whose broadcast completed (for the failure diagnosis)
        try:
            self._broadcast_all(
                pack_buckets(named_tensors, self.bucket_bytes, version=int(version), seq=seq,
                             cast_dtype=self.cast_dtype),
                stats,
            )
            t_sent = time.perf_counter()
            acks = self._wait_acks(seq, int(version))
        except WeightSyncError as e:
            raise self._fail(seq, e) from e
        except Exception as e:  # includes errors raised by the caller's iterable
            raise self._fail(seq, WeightSyncError(f"push of version {version} aborted: {e!r}")) from e
        except BaseException:  # KeyboardInterrupt etc: poison the group, let it through
            self._broken = "interrupted during a push"
            self._abort_group()
            raise
        t1 = time.perf_counter()
        for a in acks.values():
            self.versions[a["name"]] = int(version)
        return {
            "version": int(version),
            "seq": seq,
            **stats,
            "seconds": t1 - t0,
            "send_s": t_sent - t0,
            "ack_s": t1 - t_sent,
            "gbps": stats["bytes"] / max(t1 - t0, 1e-9) / 1e9,
            "acks": {a["name"]: a["version"] for a in acks.values()},
            "ack_info": {a["name"]: a for a in acks.values()},
            "refused": self.refused,
        }

    def _broadcast_all(self, buckets: Iterable[Bucket], stats: dict) -> None:
        """Pack on this thread, broadcast on a sender thread."""
        assert self._pg is not None
        pg, timeout_s = self._pg, self.timeout_s
        q: queue.Queue[Bucket | None] = queue.Queue(maxsize=1)
        state = {"busy_since": None, "error": None}

        def sender_loop() -> None:
            try:
                while (b := q.get()) is not None:
                    state["busy_since"] = time.monotonic()
                    send_bucket(pg, b, timeout_s)
                    state["busy_since"] = None
                    self._sent += 1
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
            check_done = state["error"]
            if check_done is not None:
                raise WeightSyncError(f"broadcast failed: {check_done}") from check_done
        finally:
            if thread.is_alive():  # unblock the loop if we bail out while it waits for work
                with contextlib.suppress(queue.Full):
                    q.put_nowait(None)

    def _wait_acks(self, seq: int, version: int) -> dict[int, dict]:
        deadline = time.monotonic() + self.timeout_s
        acks: dict[int, dict] = {}
        ranks = list(self.receivers)
        while True:
            for r in ranks:
                if r in acks:
                    continue
                if self._store.check([key_nack(seq, r)]):
                    err = get_json(self._store, key_nack(seq, r)).get("error", "?")
                    raise WeightSyncError(f"{describe_receiver(self._store, r)} failed to load version "
                                          f"{version}: {err}", failed_ranks={r: err})
                if self._store.check([key_ack(seq, r)]):
                    ack = get_json(self._store, key_ack(seq, r))
                    if str(ack.get("version")) != str(version):
                        msg = f"reports version {ack.get('version')!r} after loading {version}"
                        raise WeightSyncError(f"{describe_receiver(self._store, r)} {msg}",
                                              failed_ranks={r: msg})
                    acks[r] = {"name": self.receivers[r].get("name", str(r)), **ack}
            if len(acks) == len(ranks):
                return acks
            if time.monotonic() > deadline:
                raise WeightSyncError(f"no acknowledgement of version {version} within {self.timeout_s:.0f} s")
            time.sleep(0.002)

    def _fail(self, seq: int, err: WeightSyncError) -> WeightSyncError:
        """Name the receivers responsible, poison the sender; returns the error to raise."""
        ranks = list(self.receivers)
        failed = dict(err.failed_ranks)
        with contextlib.suppress(Exception):  # tell the survivors to stop waiting for this push
            self._store.set(key_abort(seq), str(err)[:2000])
        try:
            # A nack means the receiver is alive and saw the failure (often just the timeout caused
            # by another receiver); a frozen heartbeat without one points at the culprit.
            stalled = stalled_heartbeats(self._store, ranks, window_s=4 * HEARTBEAT_PERIOD_S)
            for r in ranks:
                if self._store.check([key_nack(seq, r)]):
                    err_r = get_json(self._store, key_nack(seq, r)).get("error", "?")
                    if ABORTED_BY_SENDER not in err_r:  # merely obeyed our abort: not a suspect
                        failed.setdefault(r, f"reported: {err_r}")
                elif r in stalled:
                    failed.setdefault(r, "no heartbeat (process dead or frozen)")
                elif r not in failed and not self._store.check([key_ack(seq, r)]):
                    got = self._store.add(key_progress(seq, r), 0)
                    if got < self._sent:
                        failed[r] = f"received {got} of {self._sent} buckets"
        except Exception as diag_err:  # diagnosis is best effort; the original error matters most
            failed.setdefault(-1, f"diagnosis failed: {diag_err!r}")
        who = "; ".join(f"{describe_receiver(self._store, r)}: {why}" for r, why in sorted(failed.items())
                        if r > 0) or "no receiver identified"
        msg = f"weight push #{seq} failed: {err}. Suspect receivers: {who}"
        self._broken = msg
        self._abort_group()
        return WeightSyncError(msg, failed_ranks=failed)

    def _abort_group(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            with contextlib.suppress(Exception):
                pg.abort()

    def close(self) -> None:
        self._abort_group()
        self._broken = self._broken or "closed"
