"""The outcome of one weight push on the control plane (learner side, torch only): every receiver's
acknowledgement, or, when the push fails, the receivers responsible.

Each receiver answers push k with ``ack/<k>/<r>`` (the version its engine reports after loading) or
``nack/<k>/<r>`` (its error) and counts it in ``outcomes/<k>``; see ``weightsync.protocol``. A receiver that does neither is told apart
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
    key_joined,
    key_nack,
    key_progress,
    outcome_counts,
)

ACK_STALL_S = 10.0  # a loading receiver silent this long is dead (generous: 2 busy cores can starve a beat)
JOIN_S = 30.0  # a receiver that has not entered an NCCL push this long after its announcement, while others have,
# is stalled before it (its actor loop or engine core): a healthy engine enters within a pause (< 1 s; seconds
# when its current step is a long prefill), and 30 s is the progress deadline's floor (actors.deadlines)


ACK_POLL_S = 0.05  # how often the sender reads the outcome counter (one store round trip)
ACK_SCAN_S = 1.0  # how often it also reads heartbeats and checks every ack key at once (safety net)


def wait_acks(store: dist.Store, receivers: dict[int, dict], seq: int, version: int, timeout_s: float,
              broken: Callable[[], str | None]) -> dict[int, dict]:
    """Every receiver's ack of push ``seq`` (rank -> ``{"name", **ack}``); ``receivers`` maps rank ->
    the receiver's process info. Raises ``WeightSyncError`` naming the receiver at its first nack, at an
    ack of another version, when a receiver's heartbeat stops for ACK_STALL_S while it loads (its
    process died or froze after the last byte arrived: fail then, not at the deadline), when
    ``broken()`` says the sender was closed from another thread, and after ``timeout_s`` (naming
    exactly the receivers without an ack).

    Cost: one store call (the ``outcomes/<k>`` counter, ``protocol.outcome_counts``) every ACK_POLL_S,
    plus, every ACK_SCAN_S, one call for all the ack keys at once and one heartbeat read per receiver;
    the receivers' keys are read one by one only once the counter says they are all there, or to name
    the receiver that nacked, timed out or stalled. (It ran 2 calls per receiver every 2 ms: 32 000
    calls a second for 32 receivers, on learner rank 0's one core.)"""
    deadline = time.monotonic() + timeout_s
    ranks = list(receivers)
    watch = HeartbeatWatch(store, ACK_STALL_S)
    next_scan = time.monotonic() + ACK_SCAN_S
    while True:
        acked, nacked = outcome_counts(store, seq)
        if nacked:
            _raise_first_nack(store, ranks, seq, version)
        scan = time.monotonic() >= next_scan
        if acked >= len(ranks) or (scan and store.check([key_ack(seq, r) for r in ranks])):
            return _read_acks(store, receivers, seq, version)
        if scan:
            next_scan = time.monotonic() + ACK_SCAN_S
            # watch every rank (which have acked is not known here); one that acked is not to blame
            for r in watch.stalled(ranks):
                if not store.check([key_ack(seq, r)]):
                    why = f"no heartbeat for {ACK_STALL_S:.0f} s while loading (process dead or frozen)"
                    raise WeightSyncError(f"{describe_receiver(store, r)}: {why}", failed_ranks={r: why})
        if why := broken():  # closed from another thread (the learner rebuilds the group)
            raise WeightSyncError(f"push of version {version} abandoned: sender {why}")
        if time.monotonic() > deadline:  # every byte was sent: whoever has not acked is stuck loading
            _raise_first_nack(store, ranks, seq, version)  # posted since the counter was read
            stuck = {r: f"no acknowledgement within {timeout_s:.0f} s (stuck in its update)"
                     for r in ranks if not store.check([key_ack(seq, r)])}
            if not stuck:
                return _read_acks(store, receivers, seq, version)
            raise WeightSyncError(f"no acknowledgement of version {version} within {timeout_s:.0f} s",
                                  failed_ranks=stuck)
        time.sleep(ACK_POLL_S)


def push_failure_probe(store: dist.Store, ranks: list[int], seq: int, joins: int | None = None
                       ) -> Callable[[], str | None]:
    """A ``cancelled`` probe for a data plane that holds every receiver in one transfer (NCCL's
    broadcast, ``weightsync.nccl.plane``): why push ``seq`` cannot complete, or None. The receivers it
    names, rank -> why, are in the probe's ``blamed`` (for the error's ``failed_ranks``).

    Why: a receiver that fails while loading (it posts a nack) or dies mid-push (its heartbeat stops)
    leaves the broadcast, and the sender and every other engine then wait in it, paused, until the
    push's deadline: 60 s + 15.2 GB at 0.1 GB/s = 212 s for a 7B model at the defaults, per failed
    push. This probe gives the reason at the first nack, or once a receiver without an ack has had no
    heartbeat for ACK_STALL_S, so the sender aborts within seconds.

    ``joins``: workers per receiver that count themselves into ``joined/<k>/<r>`` as they enter the push
    (the NCCL engine: TP x PP of them; None: not watched). A receiver alive but never entering (its actor
    loop or engine core stalled) was caught by nothing but the deadline, after which nobody could be blamed
    (review gpu_path_3 F3). JOIN_S after the probe was made (the announcement) such a receiver is named,
    provided some other receiver entered: when none did, the cause is shared (the announcement, the network),
    and naming every receiver would replace the whole fleet; the deadline, then the driver's one retry on a
    rebuilt group (``launch.state.recovery``), handle that. Costs what ``wait_acks`` costs: one store call
    (``outcomes/<k>``) per call (the plane polls every 50 ms), plus the heartbeats of ``ranks`` (and, after
    JOIN_S, their ``joined`` counters) once per ACK_SCAN_S."""
    watch = HeartbeatWatch(store, ACK_STALL_S)
    next_scan = time.monotonic()
    join_by = time.monotonic() + JOIN_S

    def probe() -> str | None:
        nonlocal next_scan
        if outcome_counts(store, seq)[1]:
            nack = _first_nack(store, ranks, seq)
            if nack is not None:
                return blame(nack[0], f"failed to load it: {nack[1]}")
        if time.monotonic() < next_scan:
            return None
        next_scan = time.monotonic() + ACK_SCAN_S
        for r in watch.stalled(ranks):
            if not store.check([key_ack(seq, r)]):
                return blame(r, f"has had no heartbeat for {ACK_STALL_S:.0f} s (process dead or frozen)")
        if joins is not None and time.monotonic() >= join_by:
            entered = {r: store.add(key_joined(seq, r), 0) >= joins for r in ranks}
            late = [r for r, ok in entered.items() if not ok and not store.check([key_ack(seq, r)])]
            if late and len(late) < len(ranks):
                return blame(late[0], f"did not enter push #{seq} within {JOIN_S:.3g} s of its announcement while "
                                      "the others wait in it (its actor loop or engine core is stalled)")
        return None

    def blame(rank: int, why: str) -> str:
        probe.blamed[rank] = why
        return f"was cancelled: {describe_receiver(store, rank)} {why}"

    probe.blamed = {}
    return probe


def _first_nack(store: dist.Store, ranks: list[int], seq: int) -> tuple[int, str] | None:
    """(rank, error) of the first receiver in ``ranks`` that nacked push ``seq``, if any."""
    for r in ranks:
        if store.check([key_nack(seq, r)]):
            return r, get_json(store, key_nack(seq, r)).get("error", "?")
    return None


def _raise_first_nack(store: dist.Store, ranks: list[int], seq: int, version: int) -> None:
    if (nack := _first_nack(store, ranks, seq)) is not None:
        r, err = nack
        raise WeightSyncError(f"{describe_receiver(store, r)} failed to load version {version}: {err}",
                              failed_ranks={r: err})


def _read_acks(store: dist.Store, receivers: dict[int, dict], seq: int, version: int) -> dict[int, dict]:
    """Every receiver's ack (all present), checked against ``version``."""
    acks = {}
    for r in receivers:
        ack = get_json(store, key_ack(seq, r))
        if str(ack.get("version")) != str(version):
            msg = f"reports version {ack.get('version')!r} after loading {version}"
            raise WeightSyncError(f"{describe_receiver(store, r)} {msg}", failed_ranks={r: msg})
        acks[r] = {"name": receivers[r].get("name", str(r)), **ack}
    return acks


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
