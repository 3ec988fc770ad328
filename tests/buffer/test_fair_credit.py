"""Fair credit: the max-min split of free units among waiting requests (`admission.fair_shares`), the grant
pass that applies it under the staleness rule (`BufferCore.grant_waiting`), and the service's long poll:
parked requests answered fairly, restated in place, cancelled, on a channel of the account, and a long
poll whose buffer dies failing at once."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from buffer.admission import credit_account, credit_grant, fair_shares
from buffer.client import BufferClient, BufferUnavailable
from buffer.core import BufferCore
from buffer.process import start_buffer_process
from buffer.settings import BufferSettings
from buffer.wire import encode_request
from tests.buffer.helpers import make_group


@pytest.mark.parametrize("free,wants,shares", [
    (128, [8] * 32, [4] * 32),          # the case: L = 4, 32 × 4 = 128 (first come first served: 16 × 8)
    (10, [8, 1, 1], [8, 1, 1]),         # 8 + 1 + 1 = 10 fits: everyone gets what it asked for
    (10, [8, 8, 8, 8], [3, 3, 2, 2]),   # L = 2 uses 8; the 2 left go to the two oldest
    (7, [1, 5, 2, 6], [1, 2, 2, 2]),    # L = 2: 1 + 2 + 2 + 2 = 7 (L = 3 would need 1 + 3 + 2 + 3 = 9)
    (3, [4] * 5, [1, 1, 1, 0, 0]),      # fewer units than requests: L = 0, one each to the 3 oldest
    (0, [4, 4], [0, 0]),
    (-2, [4], [0]),                     # (a queue over the window frees nothing)
    (5, [], []),
    (9, [0, 5, 0, 5], [0, 5, 0, 4]),    # L = 4 uses 8; the odd unit to the older of the two short ones
])
def test_fair_shares_golden(free, wants, shares):
    assert fair_shares(free, wants) == shares


@given(st.integers(-3, 200), st.lists(st.integers(0, 40), max_size=40))
def test_fair_shares_is_max_min_fair_in_arrival_order(free, wants):
    s = fair_shares(free, wants)
    assert sum(s) == min(max(free, 0), sum(wants))  # nothing left over while someone wants more
    assert all(0 <= x <= w for x, w in zip(s, wants))
    for i, (x, w) in enumerate(zip(s, wants)):
        if x < w:  # left short: nobody holds more than one unit more, and only those who came earlier
            assert all(y <= x + 1 for y in s)
            assert all(y <= x for y in s[i + 1:])


def test_credit_account_of_a_channel():
    assert credit_account("actor-3#credit") == "actor-3"
    assert credit_account("actor-3") == "actor-3"
    assert credit_account("a#b#c") == "a"


def test_waiting_requests_share_the_window():
    # 32 actors × 8 prompts wanted, K = 1, B = 64: (K + 1) · B = 128 units for 256 wanted
    c = BufferCore(BufferSettings(batch_prompts=64, max_staleness=1, capacity_groups=256))
    grants = c.grant_waiting([(f"a{i}", 8, 0) for i in range(32)])
    assert grants == [4] * 32
    assert c.ledger.total == 128 and c.grant_waiting([("late", 8, 0)]) == [0]


def test_a_share_never_passes_the_staleness_rule():
    # v = 1, K = 1, B = 4, nothing queued: an actor at v may take (1 + 1) · 4 = 8, one at v - 1 only 4
    c = BufferCore(BufferSettings(batch_prompts=4, max_staleness=1, capacity_groups=100))
    c.set_version(1)
    assert credit_grant(8, 0, 1, 0, 0, 4, 1, 100) == 4
    # the split gives 4 each; the old-weights request comes first and takes its 4 (slots 0-3), which
    # leaves the fresh one 8 - 4 = 4: both shares fit
    assert c.grant_waiting([("old", 8, 0), ("new", 8, 1)]) == [4, 4]
    c = BufferCore(BufferSettings(batch_prompts=4, max_staleness=1, capacity_groups=100))
    c.set_version(1)
    # fresh request first: it takes its share 4 (slots 0-3); the old one may only fill slots < 4: 0 granted,
    # and its share stays free instead of going to the actor that already had its turn
    assert c.grant_waiting([("new", 8, 1), ("old", 8, 0)]) == [4, 0]
    assert c.ledger.total == 4 and c.grant_waiting([("old", 8, 1)]) == [4]


def test_pushes_from_the_account_spend_the_channel_credit(start_buffer):
    addr = start_buffer(batch_prompts=2, max_staleness=1)
    with BufferClient(addr, "actor-5#credit", timeout_s=10) as credit, \
            BufferClient(addr, "actor-5", timeout_s=10) as pusher:
        assert credit.request_credit(2, 0).granted == 2
        assert pusher.stats()["credits_by_client"] == {"actor-5": 2}
        assert pusher.push_group(make_group("g0")).accepted
        s = pusher.stats()
        assert s["credits_by_client"] == {"actor-5": 1} and s["pushes_without_credit"] == 0
        credit.release_credit(1)
        assert pusher.stats()["credits_outstanding"] == 0


def _poll_in_thread(client: BufferClient, want: int, version: int, out: dict, key: str) -> threading.Thread:
    def go():
        out[key] = client.request_credit(want, version, wait_s=20)
        out[key + "_t"] = time.monotonic()

    t = threading.Thread(target=go)
    t.start()
    return t


def _wait_parked(stats_client: BufferClient, n: int) -> None:
    deadline = time.monotonic() + 10
    while stats_client.stats()["pending_credit_requests"] != n:
        assert time.monotonic() < deadline, "credit requests were not parked"
        time.sleep(0.02)


def test_parked_requests_share_fresh_credit_and_a_restated_one_keeps_its_turn(start_buffer):
    # B = 2, K = 0: one batch of 2 units per version
    addr = start_buffer(batch_prompts=2, max_staleness=0)
    learner = BufferClient(addr, "learner", timeout_s=10)
    hog = BufferClient(addr, "hog", timeout_s=10)
    a, b = BufferClient(addr, "a", timeout_s=10), BufferClient(addr, "b", timeout_s=10)
    assert hog.request_credit(8, 0).granted == 2  # the whole window
    out: dict = {}
    ta = _poll_in_thread(a, 4, 0, out, "a")
    _wait_parked(learner, 1)
    tb = _poll_in_thread(b, 4, 0, out, "b")
    _wait_parked(learner, 2)
    a.interrupt(0)  # a restates (same weights): it keeps its place ahead of b
    time.sleep(0.2)
    hog.release_credit(1)  # 1 unit free: the oldest waiting request, a's, gets it
    ta.join(10)
    assert out["a"].granted == 1 and "b" not in out
    hog.release_credit(1)
    tb.join(10)
    assert out["b"].granted == 1
    # first come first served would have given a both units (it asked for 4)
    assert learner.stats()["credits_by_client"] == {"a": 1, "b": 1}
    for c in (learner, hog, a, b):
        c.close()


def test_interrupt_cancels_a_long_poll_and_a_granted_stray_is_handed_out(start_buffer):
    addr = start_buffer(batch_prompts=2, max_staleness=0)
    learner = BufferClient(addr, "learner", timeout_s=10)
    a = BufferClient(addr, "a", timeout_s=10)
    assert learner.request_credit(2, 0).granted == 2  # no room left
    out: dict = {}
    t0 = time.monotonic()
    t = _poll_in_thread(a, 1, 0, out, "a")
    _wait_parked(learner, 1)
    a.interrupt()
    t.join(10)
    assert out["a"].granted == 0 and out["a_t"] - t0 < 5  # cancelled, not waited out (wait_s = 20)
    assert learner.stats()["pending_credit_requests"] == 0
    # a reply to a request the client gave up on still counts: the units are the client's (the buffer's
    # ledger says so), so the next request_credit hands them out
    learner.release_credit(2)
    a._sock.send_multipart(encode_request("credit", 7, {"want": 2, "actor_version": 0}))  # "abandoned"
    time.sleep(0.2)
    assert a.request_credit(0, 0).granted == 2
    assert learner.stats()["credits_by_client"] == {"a": 2}
    learner.close()
    a.close()


def test_a_long_poll_whose_buffer_dies_fails_at_once_and_a_restarted_buffer_serves(start_buffer):
    addr = start_buffer(batch_prompts=2, max_staleness=0)
    learner = BufferClient(addr, "learner", timeout_s=10)
    assert learner.request_credit(2, 0).granted == 2
    a = BufferClient(addr, "a", timeout_s=10)
    out: dict = {}

    def go():
        try:
            a.request_credit(1, 0, wait_s=60)
        except BufferUnavailable as e:
            out["error"] = e
        out["t"] = time.monotonic()

    t = threading.Thread(target=go)
    t.start()
    _wait_parked(learner, 1)
    proc = start_buffer.procs[-1]
    t0 = time.monotonic()
    proc.kill()
    t.join(30)
    assert "connection lost" in str(out["error"]) and out["t"] - t0 < 5  # not wait_s + timeout_s = 70 s
    proc2, addr2 = start_buffer_process(None, port=int(addr.rsplit(":", 1)[1]), batch_prompts=2, max_staleness=0)
    try:
        assert addr2 == addr and a.request_credit(1, 0, wait_s=5).granted == 1  # the same client carries on
    finally:
        proc2.terminate()
        proc2.join(10)
        a.close()
        learner.close()
