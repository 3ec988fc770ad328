"""The buffer service: one process, one ZMQ ROUTER socket, a single-threaded event loop over `BufferCore`.

Every message is decoded with the wire checks; a bad one is counted by reason, logged (rate-limited) and
answered with a structured error reply carrying its request id, and the loop carries on: no input can
crash the service or touch accepted data. Blocking pulls are parked until enough groups arrive or their
deadline passes (then a "timeout" reply), so one slow learner never blocks actors. Credit requests are
parked too, in arrival order, and each time credit is free the parked requests share it fairly
(`buffer.admission`: `fair_shares` under the staleness rule); an actor waits there instead of polling. Stored groups are
sent on as the exact frames that were validated on arrival (zero-copy, no re-encoding).

Socket options: ROUTER_HANDOVER lets a reconnecting client (new socket, same client id) take over its
identity, keeping its credits; ROUTER_MANDATORY turns a reply to a vanished client into an error, so a
batch that could not be delivered goes back to the head of the queue instead of being lost; MAXMSGSIZE
disconnects a peer sending a single frame far above the message limit before it is buffered.

Who may talk (given `RunSecrets`): the socket serves ZMQ CURVE with the run's server key pair, and a ZAP
handler on the same loop admits only peers presenting the run's client public key. A peer that fails the
handshake (no keys, another run's keys, plain text) never gets a message delivered nor a reply: its
requests go unanswered. Handshakes are counted from the socket's monitor: `stats()["auth"]` holds
`accepted` and `refused` (= refused_key: ZAP said no, + refused_protocol: no CURVE or undecryptable,
+ refused_other: dropped without detail): handshakes, so a stranger's reconnects count each time.
`refused_peers` counts peers instead: each distinct (address, CURVE key) ZAP refused, plus one when any
handshake failed before presenting a key (libzmq reports those against the listening endpoint, with no
peer address). CURVE is used whenever secrets are given, loopback included
(other users of a shared machine can reach loopback too); without secrets the service is plain, and it
warns when it listens beyond loopback like that. The service owns its ZMQ context, because a ZAP handler
answers for every socket of its context.

Addresses: the socket binds `settings.bind_address` and `address` is what clients must use
(`settings.client_address`, i.e. the node IP on a cluster — see `buffer.settings.listen_hosts`).

Start it with `buffer.process.start_buffer_process(cfg)`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import parse_monitor_message

from buffer.admission import behind, credit_account
from buffer.auth import HANDSHAKE_EVENTS, ZAP_DOMAIN, ZAP_ENDPOINT, RunSecrets, zap_answer
from buffer.checks import WireError
from buffer.core import BufferCore
from buffer.settings import BufferSettings
from buffer.snapshot import restore_snapshot, write_snapshot
from buffer.wire import Request, decode_request, encode_reply

log = logging.getLogger("buffer.service")


@dataclass
class _Wait:
    """A parked request: a pull waiting for groups, or a credit request waiting for room."""

    ident: bytes
    req: int
    deadline: float
    num: int = 0  # pull: groups wanted
    client: str = ""  # credit: who asks, how many, with which weights
    want: int = 0
    actor_version: int = 0


_REFUSALS = {zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused_key", zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "refused_protocol",
             zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "refused_other"}


class CurveGate:
    """CURVE on the service socket: server keys, a ZAP handler admitting only the run's client key, and
    handshake counters. Its two sockets are polled by the service loop (`handle`); no thread of its own."""

    def __init__(self, ctx: zmq.Context, sock: zmq.Socket, secrets: RunSecrets, counts, log_reject):
        if not secrets.server_secret:
            raise ValueError("the buffer needs the full RunSecrets (with the server's secret key), "
                             "e.g. secrets.for_server(); got a client's public() copy")
        self.client_public, self.counts, self.log_reject = secrets.client_public, counts, log_reject
        # the handler must exist before the socket accepts anyone: without one libzmq would admit every key
        self.zap = ctx.socket(zmq.REP)
        self.zap.setsockopt(zmq.LINGER, 0)
        self.zap.bind(ZAP_ENDPOINT)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secrets.server_secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, secrets.server_public)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no handler answering = refused, never admitted
        self.monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
        self.refused_peers: set[tuple[str, bytes]] = set()  # (address, CURVE key) the key check refused

    @property
    def sockets(self) -> tuple[zmq.Socket, zmq.Socket]:
        return self.zap, self.monitor

    def handle(self) -> None:
        """Answer pending ZAP requests, then count handshake outcomes. Never blocks."""
        while self.zap.poll(0):
            request = self.zap.recv_multipart()
            reply, ok = zap_answer(request, self.client_public)
            self.zap.send_multipart(reply)
            if not ok:
                peer = request[3].decode("ascii", "replace") if len(request) > 3 else "?"
                self.refused_peers.add((peer, request[6] if len(request) > 6 else b""))
                self.log_reject("auth", f"refused a client at {peer}: its CURVE key is not this run's client key")
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.counts["auth/accepted"] += 1
            elif event["event"] in _REFUSALS:
                self.counts["auth/" + _REFUSALS[event["event"]]] += 1
                if event["event"] != zmq.EVENT_HANDSHAKE_FAILED_AUTH:  # that one was logged with its peer
                    self.log_reject("auth", f"handshake failed (event {event['event']}, value {event['value']:#x}):"
                                            f" a client without this run's CURVE keys, or plain text")

    def stats(self) -> dict:
        c = {k: self.counts["auth/" + k] for k in ("accepted", *_REFUSALS.values())}
        keyless = c["refused_protocol"] + c["refused_other"] > 0  # libzmq names no peer address for these
        return {"curve": True, "refused": sum(c[k] for k in _REFUSALS.values()),
                "refused_peers": len(self.refused_peers) + keyless, **c}

    def close(self) -> None:
        self.monitor.close(0)
        self.zap.close(0)


class BufferService:
    def __init__(self, settings: BufferSettings, parent_pid: int | None = None, secrets: RunSecrets | None = None):
        self.settings = settings
        self.core = BufferCore(settings)
        self.limits = settings.limits
        self.parent_pid = parent_pid
        self._logged: Counter = Counter()
        self.ctx = zmq.Context()  # private: a ZAP handler answers for every socket of its context
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes + (1 << 20))
        self.gate = CurveGate(self.ctx, self.sock, secrets, self.core.counts, self._log_reject) if secrets else None
        self.sock.bind(settings.bind_address)
        self.bind_address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)  # tcp://0.0.0.0:PORT on a cluster
        self.address = settings.client_address(int(self.bind_address.rsplit(":", 1)[1]))  # what clients use
        self.pending: list[_Wait] = []  # pulls, FIFO
        self.pending_credit: list[_Wait] = []
        self.running = False
        self.started = time.monotonic()
        self._handlers = {"ping": self._ping, "stats": self._stats, "credit": self._credit,
                          "release": self._release, "push": self._push, "set_version": self._set_version,
                          "pull": self._pull, "add_demos": self._add_demos,
                          "snapshot": self._snapshot, "restore": self._restore}

    # ---- loop ------------------------------------------------------------------------------------------
    def serve_forever(self, stop=None) -> None:
        """Run until `stop()` (or the `stop` event is set, or the parent process is gone)."""
        self.running = True
        next_chores = 0.0
        log.info("buffer listening on %s, clients use %s (%s; K=%d, B=%d)", self.bind_address, self.address,
                 "CURVE: only this run's key" if self.gate else "plain, no authentication",
                 self.settings.max_staleness, self.settings.batch_prompts)
        if not self.gate and not self.bind_address.startswith("tcp://127."):
            log.warning("buffer listens beyond loopback (%s) without authentication: anyone who can reach it "
                        "can push training data; start it with the run's secrets", self.bind_address)
        poller = zmq.Poller()
        for s in (self.sock, *(self.gate.sockets if self.gate else ())):
            poller.register(s, zmq.POLLIN)
        try:
            while self.running and not (stop is not None and stop.is_set()):
                now = time.monotonic()
                wait = min([0.1] + [max(0.0, p.deadline - now) for p in self.pending + self.pending_credit])
                ready = dict(poller.poll(int(wait * 1000) + 1))
                if self.gate and any(s in ready for s in self.gate.sockets):
                    self.gate.handle()
                if self.sock in ready:
                    for _ in range(256):
                        try:
                            frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self.handle(frames)
                try:
                    self._serve_waiting()
                    if time.monotonic() >= next_chores:
                        next_chores = time.monotonic() + 1.0
                        self._chores()
                except Exception:  # a bug of ours must not take the buffer down
                    self.core.counts["internal_errors"] += 1
                    log.exception("internal error in the service loop")
        finally:
            self.sock.close(0)  # before the ZAP handler: never a socket without its gate
            if self.gate:
                self.gate.close()
            self.ctx.term()

    def stop(self) -> None:
        self.running = False

    def _chores(self) -> None:
        n = self.core.expire_credits()
        if n:
            log.warning("reclaimed %d credits from clients silent for %.0fs", n, self.settings.credit_ttl_s)
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            log.warning("parent process %d is gone; buffer exiting", self.parent_pid)
            self.running = False
        every = self.settings.log_every_s
        if every > 0 and time.monotonic() - getattr(self, "_last_log", self.started) >= every:
            self._last_log = time.monotonic()
            s = self.core.stats()
            log.info("buffer v%d: %d groups stored, in %d out %d, dropped_stale %d, rejected %d, credits %d, "
                     "refused handshakes %d", s["version"], s["occupancy_groups"], s["groups_in"], s["groups_out"],
                     s["dropped_stale"], s["rejected_total"], s["credits_outstanding"], self._auth_stats()["refused"])

    # ---- messages --------------------------------------------------------------------------------------
    def handle(self, frames: list) -> None:
        """Handle one routed message [identity, *body]. Never raises."""
        ident = frames[0].bytes
        name = ident.decode("utf-8", "backslashreplace")
        client = credit_account(name)  # `actor-3#credit` asks for the credit that `actor-3` spends
        self.core.counts["messages"] += 1
        req, msg_type = None, None
        try:
            request = decode_request(frames[1:], self.limits)
            req, msg_type = request.req, request.type
            self.core.touch(client)
            # A client has one request in flight at a time (pipelined pushes come before any waiting
            # request), so a new one means it gave up on whatever it had parked here; a new credit
            # request restates its parked one in place (`_credit`).
            self.pending = [p for p in self.pending if p.ident != ident]
            if request.type != "credit":
                self.pending_credit = [p for p in self.pending_credit if p.ident != ident]
            self._handlers[request.type](ident, client, request)
        except WireError as e:
            req = e.req if e.req is not None else req
            msg_type = e.msg_type or msg_type
            self.core.reject(e.reason, client, msg_type)
            self._log_reject(e.reason, f"{name}: {e}")
            self._reply(ident, req, ok=False, reason=e.reason, message=e.message)
        except Exception as e:  # a bug of ours: count it, keep serving
            self.core.reject("internal_error", client, msg_type)
            log.exception("internal error handling %s from %s", msg_type, name)
            self._reply(ident, req, ok=False, reason="internal_error", message=f"{type(e).__name__}: {e}")

    def _log_reject(self, reason: str, text: str) -> None:
        self._logged[reason] += 1
        n = self._logged[reason]
        if n <= 10 or n % 1000 == 0:
            log.warning("rejected (%s, #%d): %.300s", reason, n, text)

    def _reply(self, ident: bytes, req, ok: bool = True, reason: str = "ok", message: str = "",
               fields: dict | None = None, payload: list | tuple = ()) -> bool:
        frames = encode_reply(req, ok, reason, message, fields, payload)
        try:
            self.sock.send_multipart([ident, *frames], flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.ZMQError as e:  # EHOSTUNREACH (client gone) or EAGAIN (its queue is full)
            self.core.counts["undeliverable_replies"] += 1
            log.warning("could not reply to %r: %s", ident, e)
            return False

    def _ping(self, ident, client, r: Request) -> None:
        self._reply(ident, r.req, fields={"version": self.core.version})

    def _stats(self, ident, client, r: Request) -> None:
        self._reply(ident, r.req, fields={"stats": self._stats_now()})

    def _stats_now(self) -> dict:
        s = self.core.stats()
        s.update(pending_pulls=len(self.pending), pending_credit_requests=len(self.pending_credit),
                 uptime_s=time.monotonic() - self.started, address=self.address, bind_address=self.bind_address,
                 auth=self._auth_stats(), max_message_mb=self.settings.max_message_mb,
                 undeliverable_replies=self.core.counts["undeliverable_replies"], messages=self.core.counts["messages"])
        return s

    def _auth_stats(self) -> dict:
        return self.gate.stats() if self.gate else {"curve": False, "refused": 0, "refused_peers": 0}

    def _credit(self, ident, client, r: Request) -> None:
        """Park the request in arrival order (answered by `_serve_credit` once this batch of messages is
        handled, so requests arriving together share what is free). A client's new credit request restates
        its parked one in place (e.g. with newer weights), keeping its turn; the old one gets no answer."""
        w = _Wait(ident, r.req, time.monotonic() + r.fields.get("wait_ms", 0) / 1000, client=client,
                  want=r.fields["want"], actor_version=r.fields["actor_version"])
        k = next((k for k, p in enumerate(self.pending_credit) if p.ident == ident), None)
        if k is None:
            self.pending_credit.append(w)
        else:
            self.pending_credit[k] = w

    def _serve_credit(self, now: float) -> None:
        """Share the free credit among the parked requests, oldest first (`BufferCore.grant_waiting`), and
        answer each that got units, whose wait is over, that asked for none, or that cannot get any before
        its actor loads newer weights (then learner_version says which). The others keep their turn."""
        core, keep = self.core, []
        grants = core.grant_waiting([(w.client, w.want, w.actor_version) for w in self.pending_credit])
        for w, g in zip(self.pending_credit, grants):
            if not (g or now >= w.deadline or w.want == 0
                    or behind(w.actor_version, core.version, core.max_staleness)):
                keep.append(w)
                continue
            core.counts["credit_units_denied"] += w.want - g
            if not self._reply(w.ident, w.req, fields={"granted": g, "learner_version": core.version}):
                core.release_credit(w.client, g)  # nobody to tell: do not let the units leak
        self.pending_credit = keep

    def _release(self, ident, client, r: Request) -> None:
        self._reply(ident, r.req, fields={"released": self.core.release_credit(client, r.fields["n"])})

    def _push(self, ident, client, r: Request) -> None:
        acks, any_accepted = [], False
        for g in r.groups:
            if isinstance(g, WireError):
                self.core.reject(g.reason, client, "push")
                self._log_reject(g.reason, f"{client}: {g}")
                acks.append([False, g.reason, g.message])
            else:
                accepted, reason, message = self.core.push(client, g)
                any_accepted |= accepted
                acks.append([accepted, reason, message])
        self._reply(ident, r.req, fields={"acks": acks})
        if any_accepted:
            self._serve_waiting()

    def _set_version(self, ident, client, r: Request) -> None:
        before = self.core.max_staleness
        self.core.set_version(r.fields["version"], r.fields.get("max_staleness"))
        if self.core.max_staleness != before:
            log.info("max_staleness raised %d -> %d at version %d", before, self.core.max_staleness, self.core.version)
        # the stats ride along: the driver's one round trip after a step, answered before the credit this
        # version frees wakes the actors (their requests would queue ahead of a separate `stats`)
        self._reply(ident, r.req, fields={"version": self.core.version, "stats": self._stats_now()})

    def _pull(self, ident, client, r: Request) -> None:
        num = r.fields["num_groups"]
        if num > self.settings.capacity_groups:
            raise WireError("bad_value", f"pull: {num} groups can never be served by a buffer of "
                                         f"capacity_groups={self.settings.capacity_groups}")
        if "version" in r.fields:  # set_version + pull in one round trip
            self.core.set_version(r.fields["version"])  # validated by decode_request
        self.pending.append(_Wait(ident, r.req, time.monotonic() + r.fields["timeout_ms"] / 1000, num=num))
        self._serve_waiting()

    def _serve_waiting(self) -> None:
        now = time.monotonic()
        if self.pending_credit:
            self._serve_credit(now)
        keep, blocked = [], False
        for p in self.pending:
            groups = None if blocked else self.core.take(p.num)
            if groups is not None:
                lags = [self.core.version - g.oldest_version if g.oldest_version is not None else 0 for g in groups]
                payload = [f for g in groups for f in g.frames]
                discarded = self.core.served_discarded()
                fields = {"count": len(groups), "version": self.core.version, "lags": lags,
                          "dropped_stale": self.core.counts["dropped_stale"], "discarded": discarded}
                if self._reply(p.ident, p.req, fields=fields, payload=payload):
                    self.core.served(groups)
                else:
                    self.core.requeue_front(groups, discarded)
            elif now >= p.deadline:
                self._reply(p.ident, p.req, ok=False, reason="timeout",
                            message=f"only {len(self.core.queue)} of {p.num} groups available",
                            fields={"available": len(self.core.queue)})
            else:
                blocked = True  # FIFO: later pulls wait behind this one
                keep.append(p)
        self.pending = keep

    def _add_demos(self, ident, client, r: Request) -> None:
        n = self.core.add_demos(r.demos)
        self._reply(ident, r.req, fields={"stored": n, "demos_stored": len(self.core.demos)})

    def _snapshot(self, ident, client, r: Request) -> None:
        try:
            n = write_snapshot(self.core, r.fields["path"])
        except OSError as e:
            raise WireError("snapshot_failed", f"cannot write {r.fields['path']}: {e}") from None
        self._reply(ident, r.req, fields={"path": r.fields["path"], "bytes": n})

    def _restore(self, ident, client, r: Request) -> None:
        info = restore_snapshot(self.core, r.fields["path"])
        self._reply(ident, r.req, fields=info)
