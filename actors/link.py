"""The actor's connection to the buffer: one client on one thread, reconnects, and an outbox.

Why one thread: a ZMQ socket must not be used from two threads, and the client's calls block; the
actor's event loop must not block (the engine's output handler runs on it). Every call goes through
a single-worker executor, so calls are serialised and the loop stays free.

Why an outbox: a finished group is the product of seconds of generation. It stays in the outbox
until the buffer acknowledged it; if the buffer is unreachable (killed, restarted, network), the
client is dropped, a new one is made (same client id) and the group is sent again. Re-sending is
safe because the buffer deduplicates by `group_id`. Groups are sent oldest first.

Authentication: the link hands the run's `RunSecrets.public()` to every client it makes, so each
reconnect uses the same CURVE key pair. A refused handshake surfaces as `BufferDown` whose message
names "authentication failed" (from `buffer.client.BufferAuthError`); it is retried like any outage,
since a wrong key is a launcher bug that no retry fixes but also no reason to lose the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from buffer.records import Group

logger = logging.getLogger(__name__)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "no answer" (retry on a fresh connection), as opposed to a rejected request
    (`buffer.client.BufferRequestError`, which propagates)."""
    import zmq

    from buffer.client import BufferUnavailable

    return (BufferUnavailable, TimeoutError, ConnectionError, zmq.ZMQError)


class Backoff:
    """Exponential back-off: first, first·2, ... up to `cap` seconds; `reset` after a success."""

    def __init__(self, first: float = 0.05, cap: float = 1.0):
        self.first, self.cap, self.delay = first, cap, first

    def next(self) -> float:
        d, self.delay = self.delay, min(self.cap, self.delay * 2)
        return d

    def reset(self) -> None:
        self.delay = self.first


# (address, client_id, *, timeout_s, secrets) -> a client of the buffer; see `BufferLink`
ClientFactory = Callable[..., object]


class BufferLink:
    """Serialised, self-healing access to a client of the buffer (`buffer.client.BufferClient`).

    `call(name, *args)` runs `client.<name>(*args)` on the link's thread; a transport failure drops
    the client (the next call makes a fresh one) and raises `BufferDown`. `interrupt` reaches a call
    waiting on the thread (a credit long poll) from outside it. Counters: `reconnects`.
    secrets: the run's `RunSecrets.public()` when the buffer serves CURVE; None = plain.
    client_factory: makes each client, called as `client_factory(address, client_id, timeout_s=...,
    secrets=...)`; None = the ZMQ `BufferClient`. Another transport is a class with the calls the actor
    makes (`request_credit`, `push_group`, `release_credit`, `interrupt`, `close`, and the credit it
    was owed, `_unclaimed`) that raises `buffer.client.BufferUnavailable` when the buffer does not
    answer, passed here.
    """

    def __init__(self, address: str, client_id: str, timeout_s: float = 30.0, secrets=None,
                 client_factory: ClientFactory | None = None):
        if client_factory is None:
            from buffer.client import BufferClient

            client_factory = BufferClient

        self.address, self.client_id, self.timeout_s, self.secrets = address, client_id, timeout_s, secrets
        self._factory = client_factory
        self._client = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"buffer-link-{client_id}")
        self._errors = _transport_errors()
        self.connects = 0
        self.failures = 0
        self._unclaimed = 0  # credit a dropped client was owed (`BufferClient._stray`), for its successor

    def _run(self, name: str, args: tuple):
        try:
            if self._client is None:
                self._client = self._factory(self.address, self.client_id, timeout_s=self.timeout_s,
                                             secrets=self.secrets)
                self._client._unclaimed, self._unclaimed = self._unclaimed, 0
                self.connects += 1
            return getattr(self._client, name)(*args)
        except self._errors as e:
            self.failures += 1
            self._drop()
            raise BufferDown(f"buffer at {self.address} unreachable during {name}: {e!r}") from e

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            self._unclaimed += client._unclaimed
            with contextlib.suppress(Exception):
                client.close()

    async def call(self, name: str, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, name, args)

    def interrupt(self, actor_version: int | None = None) -> None:
        """End the credit long poll waiting on the link's thread (None), or restate it with newer weights
        (`buffer.client.BufferClient.interrupt`); thread-safe, returns at once."""
        client = self._client
        if client is not None:
            client.interrupt(actor_version)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pool.submit(self._drop).result(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def reconnects(self) -> int:
        return max(0, self.connects - 1)


class BufferDown(RuntimeError):
    """The buffer did not answer (timeout or broken connection); the call may be retried."""


class Outbox:
    """Finished groups waiting for the buffer's acknowledgement, and the task that delivers them."""

    def __init__(self, link: BufferLink, on_sent=None):
        self.link = link
        self.pending: deque[Group] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.on_sent = on_sent  # callback(group, ack) after an acknowledgement
        self.sent = 0
        self.resent = 0  # sends of a group whose earlier send failed in transport
        self.rejected: dict[str, int] = {}  # reason -> count
        self.down_s = 0.0  # seconds spent with the buffer unreachable
        self.push_s = 0.0  # seconds of successful push calls (encode + send + acknowledgement)

    def put(self, group: Group) -> None:
        self.pending.append(group)
        self._idle.clear()
        self._wake.set()

    def __len__(self) -> int:
        return len(self.pending)

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every group was acknowledged; False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def run(self) -> None:
        """Deliver forever (cancel to stop). Transport failures back off and re-send the same group."""
        backoff = Backoff(0.05, 2.0)
        failed_once = False
        while True:
            if not self.pending:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            group = self.pending[0]
            t_push = time.monotonic()
            try:
                ack = await self.link.call("push_group", group)
            except BufferDown as e:
                t = backoff.next()
                logger.warning("%s; re-sending group %s in %.2f s", e, group.group_id, t)
                t0 = time.monotonic()
                await asyncio.sleep(t)
                self.down_s += time.monotonic() - t0
                failed_once = True
                continue
            self.push_s += time.monotonic() - t_push
            backoff.reset()
            if failed_once:
                self.resent += 1
                failed_once = False
            self.pending.popleft()
            if ack.accepted:
                self.sent += 1
            else:
                self.rejected[ack.reason] = self.rejected.get(ack.reason, 0) + 1
                routine = ack.reason in ("stale", "duplicate") or ack.reason.startswith("filtered")
                logger.log(logging.DEBUG if routine else logging.WARNING, "buffer did not keep group %s: %s %s",
                           group.group_id, ack.reason, getattr(ack, "message", ""))
            if self.on_sent is not None:
                self.on_sent(group, ack)
