"""How each end of the weight sync learns that the other is gone (torch only; both ends use it).

A receiver's process bumps its heartbeat counter (``hb/<rank>``) from a daemon thread, so the sender
tells a dead or frozen receiver (counter still) from a slow one (``HeartbeatWatch``,
``stalled_heartbeats``). The sender sets ``abort/<k>`` when it gives up on push k, and a receiver
polls it (``abort_probe``) instead of sitting out its transfer's timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from weightsync.protocol import connect_store, group_store, key_abort, key_heartbeat, key_unformed

HEARTBEAT_PERIOD_S = 0.25


def abort_probe(store: dist.Store, seq: int) -> Callable[[], str | None]:
    """``aborted`` callback for ``iter_buckets``: the sender's abort message for push ``seq``, if any."""
    key = key_abort(seq)

    def probe() -> str | None:
        try:
            return store.get(key).decode() if store.check([key]) else None
        except Exception as e:  # the sender's store is gone: so is the sender
            return f"sender unreachable ({e})"

    return probe


def unformed_probe(store: dist.Store) -> Callable[[], str | None]:
    """``cancelled`` callback for a receiver's rendezvous: why the sender gave up on forming the group (its
    ``unformed`` key), if it did."""
    key = key_unformed()

    def probe() -> str | None:
        try:
            why = store.get(key).decode() if store.check([key]) else None
        except Exception as e:  # the sender's store is gone: so is the sender
            why = f"sender unreachable ({e})"
        return None if why is None else f"was cancelled: the learner gave up on this group ({why})"

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
