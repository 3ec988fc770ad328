"""The outcome of one weight push on the control plane (learner side, torch only): every receiver's
acknowledgement, or, when the push fails, the receivers responsible.

Each receiver answers push k with ``ack/<k>/<r>`` (the version its engine reports after loading) or
``nack/<k>/<r>`` (its error); see ``weightsync.protocol``. A receiver that does neither is told apart
by its heartbeat (``weightsync.liveness``): still beating means stuck in its update, a frozen counter
means dead or frozen, and on the gloo plane its progress key says how many buckets it received.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

from weightsync.liveness import HEARTBEAT_PERIOD_S, HeartbeatWatch, stalled_heartbeats
from weightsync.protocol import (
    ABORTED_BY_SENDER,
    WeightSyncError,
    describe_receiver,
    get_json,
    key_ack,
    key_nack,
    key_progress,
)

ACK_STALL_S = 10.0  # a loading receiver silent this long is dead (generous: 2 busy cores can starve a beat)


def wait_acks(store: dist.Store, receivers: dict[int, dict], seq: int, version: int, timeout_s: float,
              broken: Callable[[], str | None]) -> dict[int, dict]:
    """Every receiver's ack of push ``seq`` (rank -> ``{"name", **ack}``); ``receivers`` maps rank ->
    the receiver's process info. Raises ``WeightSyncError`` naming the receiver at its first nack, at an
    ack of another version, when a receiver's heartbeat stops for ACK_STALL_S while it loads (its
    process died or froze after the last byte arrived: fail then, not at the deadline), when
    ``broken()`` says the sender was closed from another thread, and after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    acks: dict[int, dict] = {}
    ranks = list(receivers)
    watch, next_beat_check = HeartbeatWatch(store, ACK_STALL_S), 0.0
    while True:
        for r in ranks:
            if r in acks:
                continue
            if store.check([key_nack(seq, r)]):
                err = get_json(store, key_nack(seq, r)).get("error", "?")
                raise WeightSyncError(f"{describe_receiver(store, r)} failed to load version "
                                      f"{version}: {err}", failed_ranks={r: err})
            if store.check([key_ack(seq, r)]):
                ack = get_json(store, key_ack(seq, r))
                if str(ack.get("version")) != str(version):
                    msg = f"reports version {ack.get('version')!r} after loading {version}"
                    raise WeightSyncError(f"{describe_receiver(store, r)} {msg}", failed_ranks={r: msg})
                acks[r] = {"name": receivers[r].get("name", str(r)), **ack}
        if len(acks) == len(ranks):
            return acks
        if time.monotonic() >= next_beat_check:
            next_beat_check = time.monotonic() + HEARTBEAT_PERIOD_S
            if stalled := watch.stalled([r for r in ranks if r not in acks]):
                why = f"no heartbeat for {ACK_STALL_S:.0f} s while loading (process dead or frozen)"
                raise WeightSyncError(f"{describe_receiver(store, stalled[0])}: {why}",
                                      failed_ranks={stalled[0]: why})
        if why := broken():  # closed from another thread (the learner rebuilds the group)
            raise WeightSyncError(f"push of version {version} abandoned: sender {why}")
        if time.monotonic() > deadline:  # every byte was sent: whoever has not acked is stuck loading
            stuck = {r: f"no acknowledgement within {timeout_s:.0f} s (stuck in its update)"
                     for r in ranks if r not in acks}
            raise WeightSyncError(f"no acknowledgement of version {version} within {timeout_s:.0f} s",
                                  failed_ranks=stuck)
        time.sleep(0.002)


def name_suspects(store: dist.Store, ranks: list[int], seq: int, failed: dict[int, str],
                  buckets_sent: int | None) -> dict[int, str]:
    """``failed`` (rank -> why, from the error that ended push ``seq``) completed with the receivers the
    store points at: a nack that is not merely obedience to the sender's abort, a frozen heartbeat
    (watched for a few beats), or fewer buckets received than ``buckets_sent`` (planes that count
    them; None otherwise). Best effort: a failing diagnosis is recorded under rank -1."""
    failed = dict(failed)
    try:
        # A nack means the receiver is alive and saw the failure (often just the timeout caused
        # by another receiver); a frozen heartbeat without one points at the culprit.
        stalled = stalled_heartbeats(store, ranks, window_s=4 * HEARTBEAT_PERIOD_S)
        for r in ranks:
            if store.check([key_nack(seq, r)]):
                err_r = get_json(store, key_nack(seq, r)).get("error", "?")
                if ABORTED_BY_SENDER not in err_r:  # merely obeyed our abort: not a suspect
                    failed.setdefault(r, f"reported: {err_r}")
            elif r in stalled:
                failed.setdefault(r, "no heartbeat (process dead or frozen)")
            elif buckets_sent is not None and r not in failed and not store.check([key_ack(seq, r)]):
                got = store.add(key_progress(seq, r), 0)
                if got < buckets_sent:
                    failed[r] = f"received {got} of {buckets_sent} buckets"
    except Exception as diag_err:  # diagnosis is best effort; the original error matters most
        failed.setdefault(-1, f"diagnosis failed: {diag_err!r}")
    return failed
