"""The client actors and the learner use to talk to the buffer service (ZMQ DEALER, request/reply).

One request is in flight at a time per client (calls are serialised by a lock; use one client per
thread for parallelism). Each request carries an id; a reply to an earlier, abandoned request is
discarded. If no reply arrives within the deadline the socket is replaced by a fresh one with the same
client id (the service hands the identity over, so the client keeps its credits) and the call raises
`BufferUnavailable`; the next call goes out on the new socket, so a restarted buffer is picked up
transparently. Pushes are safe to repeat after such an error: the buffer recognises a group_id it
already holds and does not store it twice.

A request the buffer rejects comes back as a structured reply: `push_group` turns it into
`Ack(accepted=False, reason, message)`, other calls raise `BufferRequestError(reason, message)`.

Beyond the agreed API (all optional): `request_credit(..., wait_s)` lets the buffer hold the request
until it can grant something instead of the actor polling (a long poll, which `interrupt`, from another
thread, cancels or restates with newer weights without losing its turn); `pull_batch(..., version=v)`
does set_version(v) and the pull in one round trip; `last_pull` holds the served groups' lags. A push
message may carry several groups (one Ack each): `_push` takes a list, and a request to pipeline behind.

A connection that drops while a call waits (the buffer process died) fails the call at once with
`BufferUnavailable` rather than at its deadline, which for a long poll is wait_s later.

Authentication: with `secrets=RunSecrets.public()` the socket speaks ZMQ CURVE with the run's client key
pair and checks the buffer's server key. A buffer that refuses the handshake delivers nothing and
answers nothing, so the call times out; the client watches its socket's handshake events and then
raises `BufferAuthError` (a `BufferUnavailable`) naming the reason — no keys, a key that is not this
run's, or a server key that does not match.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import random
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from buffer.auth import HANDSHAKE_EVENTS, RunSecrets, handshake_problem
from buffer.checks import Limits, WireError
from buffer.records import Group
from buffer.wire import (
    decode_reply,
    encode_demos,
    encode_group,
    encode_request,
    groups_from_reply,
)

_REPLY_LIMITS = Limits(max_message_bytes=1 << 40, max_header_bytes=256 << 20, max_frames=1 << 22,
                       max_samples=1 << 20, max_tokens=1 << 30, max_list=1 << 26)
_MONITORS = itertools.count()  # unique inproc names for the sockets' handshake monitors


class BufferUnavailable(ConnectionError):
    """The buffer did not answer within the client's timeout."""


class BufferAuthError(BufferUnavailable):
    """The buffer did not answer because it refused this client's handshake (keys missing or wrong)."""


class BufferRequestError(WireError):
    """The buffer answered with an error reply (e.g. a rejected message); `reason` is its code."""


@dataclass(frozen=True)
class Credit:
    granted: int  # prompts (groups) the actor may start now
    learner_version: int


@dataclass(frozen=True)
class Ack:
    accepted: bool  # the buffer holds the group (or already held it: reason "duplicate")
    reason: str  # "ok", "duplicate", "stale", "filtered_extreme", "missing_demo", a wire reason code, ...
    message: str = ""


class BufferClient:
    def __init__(self, address: str, client_id: str, timeout_s: float = 30.0, *, secrets: RunSecrets | None = None,
                 context: zmq.Context | None = None, demo_chunk_mb: float = 8.0, max_message_mb: float = 64.0):
        """secrets: the run's `RunSecrets.public()` when the buffer serves CURVE; None = plain."""
        ident = client_id.encode()
        if not 1 <= len(ident) <= 255 or ident[0] == 0:
            raise ValueError(f"client_id {client_id!r}: must be 1-255 bytes and not start with a NUL byte")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if secrets is not None and not secrets.client_secret:
            raise ValueError("BufferClient(secrets=...): need the run's client key pair (RunSecrets.public()), "
                             "not the buffer's for_server() copy")
        self._secrets = secrets
        self.address, self.client_id, self.timeout_s = address, client_id, float(timeout_s)
        self._ident = ident
        self._ctx = context or zmq.Context.instance()
        self._lock = threading.Lock()
        self._req = random.SystemRandom().randrange(1 << 40)  # distinct from any earlier client with this id
        self._demo_chunk = int(demo_chunk_mb * (1 << 20))
        self._max_message = int(max_message_mb * (1 << 20))  # pushes are split to stay under the buffer's limit
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._problem: str | None = None  # the latest handshake failure (`_handshake_problem`)
        self._lost = False  # the connection dropped since the events were last read (`_read_events`)
        self._wake_r, self._wake_w = socket.socketpair()  # `interrupt` wakes a long poll through it
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._interrupts: collections.deque = collections.deque()  # versions (None: cancel) from `interrupt`
        self._unclaimed = 0  # credit granted to requests this client gave up on (`_stray`)
        self.last_pull: dict = {}  # version, lags, dropped_stale, discarded of the latest pull_batch
        self._connect()

    # ---- plumbing --------------------------------------------------------------------------------------
    def _connect(self) -> None:
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, self._ident)
        s.setsockopt(zmq.LINGER, 0)
        # a DEALER blocks a send while it has no connection (e.g. its handshake was refused): bound it
        s.setsockopt(zmq.SNDTIMEO, max(1, int(self.timeout_s * 1000)))
        if self._secrets is not None:
            s.setsockopt(zmq.CURVE_SERVERKEY, self._secrets.server_public)
            s.setsockopt(zmq.CURVE_PUBLICKEY, self._secrets.client_public)
            s.setsockopt(zmq.CURVE_SECRETKEY, self._secrets.client_secret)
        self._monitor = s.get_monitor_socket(HANDSHAKE_EVENTS | zmq.EVENT_DISCONNECTED,
                                             f"inproc://buffer-client-{os.getpid()}-{next(_MONITORS)}")
        s.connect(self.address)
        self._sock = s

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close(0)
            self._sock = self._monitor = None

    def reconnect(self) -> None:
        """Replace the socket by a fresh one with the same client id (done automatically on timeouts)."""
        self._close_socket()
        self._connect()

    def _read_events(self) -> None:
        """Take the socket's monitor events: the latest handshake failure since the latest success
        (`_problem`; it outlives reconnects: a fresh socket's own refusal may not have been reported yet
        when its call times out) and whether the connection dropped (`_lost`)."""
        while self._monitor.poll(0):
            event = parse_monitor_message(self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._lost = True
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._problem = None
            else:
                self._problem = handshake_problem(event["event"], event["value"],
                                                  self._secrets is not None) or self._problem

    def _handshake_problem(self) -> str | None:
        self._read_events()
        return self._problem

    def interrupt(self, actor_version: int | None = None) -> None:
        """Thread-safe: end the credit long poll in flight (or the next one) at once, answered with what it
        was granted so far (None), or restate it with newer weights (`actor_version`), keeping its turn in
        the buffer's queue. Either way the buffer is told, so no unit granted meanwhile is lost."""
        self._interrupts.append(actor_version)
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
            self._wake_w.send(b"\0")

    def _stray(self, rep) -> None:
        """A reply to a request given up on (timed out, restated): credit it granted is ours all the same
        (the buffer counts it against this client), so it is handed out by the next `request_credit`."""
        granted = rep.fields.get("granted") if rep.ok else None
        if isinstance(granted, int) and granted > 0:
            self._unclaimed += granted

    def _call(self, type_: str, fields: dict | None = None, payload=(), wait_s: float | None = None):
        return self._call_many([(type_, fields, payload)], wait_s)[0]

    def _call_many(self, requests: list, wait_s: float | None = None, restate=None) -> list:
        """Send all requests back to back (pipelined), then collect one reply per request.

        restate: the last request is a long poll that `interrupt` may end or restate; restate(version)
        is the request to send then (version None: a cancel). Its first answer (to it or to a restatement)
        counts; a later one is a stray (`_stray`). A connection lost while waiting fails the call at once
        (the request or its reply may be gone), like a timeout."""
        with self._lock:
            if self._sock is None:
                raise RuntimeError("BufferClient is closed")
            wait = self.timeout_s if wait_s is None else wait_s
            deadline = time.monotonic() + wait
            first = self._req + 1
            self._req += len(requests)
            slot = {first + k: k for k in range(len(requests))}  # request id -> which reply it answers
            replies: dict[int, object] = {}
            what = requests[0][0] if len(requests) == 1 else f"{len(requests)} requests"
            poller = zmq.Poller()
            for x in (self._sock, self._monitor, *((self._wake_r,) if restate else ())):
                poller.register(x, zmq.POLLIN)
            try:
                self._read_events()
                self._lost = False  # a drop before this call is no reason to fail it: ZMQ reconnects
                for k, (type_, fields, payload) in enumerate(requests):
                    self._sock.send_multipart(encode_request(type_, first + k, fields, payload), copy=False)
                while len(replies) < len(requests):
                    left = deadline - time.monotonic()
                    ready = dict(poller.poll(max(1, int(left * 1000)))) if left > 0 else {}
                    self._read_events()
                    if not ready or self._lost:
                        text = (f"buffer at {self.address} did not answer {what!r} within {wait:.1f}s" if not ready
                                else f"buffer at {self.address}: connection lost while waiting for {what!r}")
                        raise BufferAuthError(f"{text}: {self._problem}") if self._problem else BufferUnavailable(text)
                    if self._wake_r.fileno() in ready:  # (a plain socket is reported by its descriptor)
                        self._restate(restate, slot, len(requests) - 1)
                    if self._sock in ready:
                        rep = decode_reply(self._sock.recv_multipart(copy=False), _REPLY_LIMITS)
                        if rep.req == -1 and not rep.ok:  # unreadable request: blame the oldest unanswered one
                            rep.req = next(r for r, k in slot.items() if k not in replies)
                        k = slot.get(rep.req)
                        if k is None or k in replies:
                            self._stray(rep)  # the reply to an earlier, abandoned request
                        else:
                            replies[k] = rep
            except BufferUnavailable:
                self.reconnect()
                raise
            except zmq.ZMQError as e:
                problem = self._handshake_problem()
                self.reconnect()
                text = f"buffer at {self.address}: {e}"
                raise (BufferAuthError(f"{text}: {problem}") if problem else BufferUnavailable(text)) from e
            return [replies[k] for k in range(len(requests))]

    def _restate(self, restate, slot: dict, k: int) -> None:
        """Send the long poll's restatements (or its cancel) that `interrupt` queued."""
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        while self._interrupts:
            self._req += 1
            type_, fields, payload = restate(self._interrupts.popleft())
            self._sock.send_multipart(encode_request(type_, self._req, fields, payload), copy=False)
            slot[self._req] = k

    @staticmethod
    def _check(rep) -> None:
        if not rep.ok:
            raise BufferRequestError(rep.reason, rep.message)

    # ---- actor side ------------------------------------------------------------------------------------
    def request_credit(self, want: int, actor_version: int, wait_s: float = 0.0) -> Credit:
        """Ask to start `want` prompts with weights of `actor_version`; start only `granted` of them.
        With wait_s > 0 the buffer holds the request in its queue until it can grant something (waiting
        requests share free credit fairly, `buffer.admission`), or until wait_s, or until it is clear no
        credit can come before the actor loads newer weights (then granted is 0 and learner_version says
        which version to load) — no polling needed; `interrupt` ends or restates such a wait. `granted`
        includes units granted to requests this client gave up on earlier (`_stray`)."""
        restate = None
        if wait_s > 0:  # a long poll: `interrupt` may cancel it or restate it with newer weights
            until = time.monotonic() + wait_s

            def restate(version: int | None) -> tuple:
                if version is None:
                    return "credit", self._credit_fields(0, actor_version, 0.0), ()
                return "credit", self._credit_fields(want, max(version, actor_version), until - time.monotonic()), ()

        rep = self._call_many([("credit", self._credit_fields(want, actor_version, wait_s), ())],
                              wait_s + self.timeout_s, restate)[0]
        return self._credit(rep)

    def _credit(self, rep) -> Credit:
        self._check(rep)
        granted, self._unclaimed = rep.fields["granted"] + self._unclaimed, 0
        return Credit(granted, rep.fields["learner_version"])

    def push_group(self, group: Group) -> Ack:
        """Send one finished group (uses one credit). Bad data comes back as Ack(False, reason, message)."""
        return self._push([group])[0][0]

    @staticmethod
    def _credit_fields(want: int, actor_version: int, wait_s: float) -> dict:
        fields = {"want": int(want), "actor_version": int(actor_version)}
        if wait_s > 0:
            fields["wait_ms"] = int(wait_s * 1000)
        return fields

    def _push(self, groups: list[Group], then: tuple | None = None,
              wait_s: float = 0.0) -> tuple[list[Ack], Credit | None]:
        """Push `groups` in as few messages as the message limit allows (one Ack each, same order); `then`,
        a credit request (type, fields, payload), is pipelined behind them and its Credit returned (the
        buffer handles one client's requests in order), waiting up to its `wait_s` more."""
        acks: list[Ack | None] = [None] * len(groups)
        messages: list[tuple[list[int], list]] = []  # (group slots, frames), each under the message limit
        size = self._max_message
        for i, g in enumerate(groups):
            try:
                frames = encode_group(g)
            except WireError as e:  # never reaches the buffer: its credit is given back below
                acks[i] = Ack(False, e.reason, e.message)
                continue
            nbytes = sum(memoryview(f).nbytes for f in frames)
            if size + nbytes > self._max_message:
                messages.append(([], []))
                size = 1024
            messages[-1][0].append(i)
            messages[-1][1].extend(frames)
            size += nbytes
        requests = [("push", {"count": len(slots)}, frames) for slots, frames in messages]
        local_failures = sum(a is not None for a in acks)
        if local_failures:
            requests.append(("release", {"n": local_failures}, ()))
        if then:
            requests.append(then)
        replies = self._call_many(requests, wait_s + self.timeout_s) if requests else []
        for (slots, _), rep in zip(messages, replies):
            for k, i in enumerate(slots):
                if not rep.ok:  # the whole message was refused (e.g. too large)
                    acks[i] = Ack(False, rep.reason, rep.message)
                else:
                    accepted, reason, message = rep.fields["acks"][k]
                    acks[i] = Ack(bool(accepted), reason, message)
        return acks, self._credit(replies[-1]) if then else None

    def release_credit(self, n: int) -> None:
        """Give back unused credit (e.g. an actor stopping; a restarted actor can release 2**20 to drop
        whatever an earlier incarnation with the same client_id still held). Credit granted to requests this
        client gave up on (`_stray`) is released with it."""
        n, self._unclaimed = int(n) + self._unclaimed, 0
        self._check(self._call("release", {"n": max(0, min(n, 1 << 20))}))

    # ---- learner side ----------------------------------------------------------------------------------
    def set_version(self, version: int, max_staleness: int | None = None) -> dict:
        """Tell the buffer the learner's version (and a raised staleness bound, versions: `max_staleness:
        auto`); returns the buffer's `stats` as of just after it."""
        fields = {"version": int(version)} | ({} if max_staleness is None else {"max_staleness": int(max_staleness)})
        rep = self._call("set_version", fields)
        self._check(rep)
        return rep.fields["stats"]

    def pull_batch(self, num_groups: int, timeout_s: float, version: int | None = None) -> list[Group]:
        """Exactly `num_groups` whole groups, FIFO, none staler than max_staleness; TimeoutError if the buffer
        does not have them within `timeout_s`. `version` (optional) = set_version(version) first, in the
        same round trip."""
        fields = {"num_groups": int(num_groups), "timeout_ms": int(max(0.0, timeout_s) * 1000)}
        if version is not None:
            fields["version"] = int(version)
        rep = self._call("pull", fields, wait_s=max(0.0, timeout_s) + self.timeout_s)
        if not rep.ok and rep.reason == "timeout":
            raise TimeoutError(f"pull_batch({num_groups}): {rep.message} after {timeout_s:.1f}s")
        self._check(rep)
        groups = [wg.to_group() for wg in groups_from_reply(rep, _REPLY_LIMITS)]
        if len(groups) != num_groups:
            raise BufferRequestError("bad_frames", f"asked for {num_groups} groups, got {len(groups)}")
        self.last_pull = {k: rep.fields.get(k) for k in ("version", "lags", "dropped_stale")}
        self.last_pull["discarded"] = [(int(e), int(i)) for e, i in rep.fields.get("discarded", [])]
        return groups

    def add_demos(self, demos: dict[int, np.ndarray], rewards: dict[int, float] | float = 1.0) -> None:
        """Store demonstrations (token arrays keyed by prompt_index; reward of the attached rows, default 1)."""
        chunk: dict[int, np.ndarray] = {}
        size = 0
        for i, toks in demos.items():
            chunk[i] = toks
            size += np.asarray(toks).size * 4
            if size >= self._demo_chunk:
                self._send_demos(chunk, rewards)
                chunk, size = {}, 0
        if chunk or not demos:
            self._send_demos(chunk, rewards)

    def _send_demos(self, chunk: dict[int, np.ndarray], rewards) -> None:
        fields, frames = encode_demos(chunk, rewards)
        self._check(self._call("add_demos", fields, frames))

    def stats(self) -> dict:
        rep = self._call("stats")
        self._check(rep)
        return rep.fields["stats"]

    def snapshot(self, path: str) -> None:
        self._check(self._call("snapshot", {"path": os.path.abspath(path)}))

    def restore(self, path: str) -> None:
        self._check(self._call("restore", {"path": os.path.abspath(path)}))

    def close(self) -> None:
        with self._lock:
            self._close_socket()
            self._wake_r.close()
            self._wake_w.close()

    def __enter__(self) -> BufferClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
