"""BufferCore in-process: the admission rule, K=0 synchrony, drops, filters, demonstrations, dedup, snapshot."""

from __future__ import annotations

import numpy as np
import pytest

from buffer.admission import credit_grant
from buffer.checks import WireError
from buffer.core import BufferCore
from buffer.settings import BufferSettings
from buffer.snapshot import restore_snapshot, write_snapshot
from tests.buffer.helpers import assert_same_group, make_group, wire


def core(**kw) -> BufferCore:
    return BufferCore(BufferSettings(**{"batch_prompts": 2, "max_staleness": 1, **kw}))


@pytest.mark.parametrize("want,a,v,queued,served,B,K,cap,expected", [
    (10, 0, 0, 0, 0, 4, 0, 100, 4),     # K=0: one batch at the current version
    (10, 0, 0, 3, 0, 4, 0, 100, 1),     # ... minus what is queued
    (10, 0, 0, 0, 4, 4, 0, 100, 0),     # ... minus what was served at this version (next batch goes out at v+1)
    (10, 4, 5, 0, 0, 4, 0, 100, 0),     # actor behind the learner gets nothing at K=0
    (10, 4, 5, 0, 0, 4, 2, 100, 8),     # (K + a - v + 1) * B = 2 * 4
    (10, 9, 5, 0, 0, 4, 1, 100, 8),     # an actor claiming to be ahead counts as at v
    (10, 5, 5, 0, 0, 4, 3, 6, 6),       # capacity bound
    (3, 5, 5, 0, 0, 4, 3, 100, 3),      # never more than wanted
    (10, 0, 5, 0, 0, 4, 3, 100, 0),     # far behind: nothing
])
def test_credit_rule(want, a, v, queued, served, B, K, cap, expected):
    assert credit_grant(want, a, v, queued, served, B, K, cap) == expected


def test_k0_is_synchronous():
    c = core(max_staleness=0, batch_prompts=3)
    assert c.request_credit("a1", 10, 0) == 3
    assert c.request_credit("a2", 10, 0) == 0  # one batch's worth in total
    for i in range(3):
        assert c.push("a1", wire(make_group(f"g{i}", version=0)))[0]
    assert c.served(c.take(3)) == [0, 0, 0]
    assert c.request_credit("a2", 10, 0) == 0  # the batch is being trained at v=0
    c.set_version(1)
    assert c.request_credit("a2", 10, 0) == 0  # old weights: wait for the new version
    assert c.request_credit("a2", 10, 1) == 3


def test_stale_groups_are_dropped_and_counted_never_served():
    c = core(max_staleness=1, batch_prompts=1)
    assert c.push("a", wire(make_group("old", version=0)))[0]
    assert c.push("a", wire(make_group("new", version=2)))[0]
    c.set_version(2)  # "old" is now 2 behind: dropped when the version advances
    assert [g.group_id for g in c.take(1)] == ["new"]
    acc, reason, msg = c.push("a", wire(make_group("late", version=0)))
    assert (acc, reason) == (False, "stale") and "more than 1 behind" in msg
    s = c.stats()
    assert s["dropped_stale"] == 2 and s["dropped"] == {"stale_on_version": 1, "stale_on_arrival": 1}
    with pytest.raises(WireError, match="never go back"):
        c.set_version(1)


def test_a_raised_bound_opens_credit_and_holds_stored_groups_to_the_bound_they_were_admitted_under(tmp_path):
    """max_staleness: auto raises K through set_version: new credit and arrivals get the new bound, a group
    stored before keeps its own (also through a snapshot), and the bound is never lowered."""
    c = core(max_staleness=1, batch_prompts=1)
    assert c.request_credit("a", 10, 0) == 2  # (K + 1) * B
    assert c.push("a", wire(make_group("early", version=0)))[0]  # admitted under K = 1
    c.set_version(1, max_staleness=3)
    assert c.stats()["max_staleness"] == 3 and c.request_credit("a", 10, 0) == 1  # (3 + 0 - 1 + 1) - 2 queued
    assert c.push("a", wire(make_group("late", version=0)))[0]  # admitted under K = 3
    path = tmp_path / "snap.msgpack"
    write_snapshot(c, str(path))
    d = core(max_staleness=1, batch_prompts=1)
    restore_snapshot(d, str(path))
    for buf in (c, d):
        buf.set_version(2, max_staleness=3)  # "early" is 2 behind its bound of 1: dropped; "late" is not
        assert [g.group_id for g in buf.queue] == ["late"] and buf.stats()["dropped_stale"] == 1
        assert buf.served(buf.take(1)) == [2]
    with pytest.raises(WireError, match="never lowered"):
        c.set_version(2, max_staleness=2)


def test_discarded_prompts_are_handed_to_the_learner_once_and_put_back_with_an_undelivered_batch():
    """Filtered and stale-dropped groups settle their (epoch, prompt) for the ledger (`launch.state.ledger`):
    the keys go out with the next pull, once, and return to the list when that reply is not delivered."""
    c = core(filter="extreme", max_staleness=1, batch_prompts=1)
    c.push("a", wire(make_group("solved", rewards=[1, 1, 1, 1], prompt_index=7, meta={"epoch": 2})))
    c.push("a", wire(make_group("old", version=0, prompt_index=8, meta={"epoch": 2})))
    c.push("a", wire(make_group("new", version=2, prompt_index=9)))
    c.set_version(2)  # drops "old"
    assert [g.group_id for g in c.take(1)] == ["new"]  # held prompts are not discarded ones
    keys = c.served_discarded()
    assert keys == [[2, 7], [2, 8]] and c.served_discarded() == []
    c.push("a", wire(make_group("late", version=0, prompt_index=5)))
    c.requeue_front([], keys)  # the reply carrying them was not delivered
    assert c.served_discarded() == [[2, 7], [2, 8], [0, 5]]


def test_credit_is_consumed_by_push_and_released_by_drops_and_filters():
    c = core(filter="extreme", batch_prompts=4)
    assert c.request_credit("a", 8, 0) == 8  # (K + 1) * B
    c.push("a", wire(make_group("all0", rewards=[0, 0, 0, 0])))
    c.push("a", wire(make_group("mixed")))
    assert c.ledger.total == 6 and c.queued == 7
    c.release_credit("a", 100)
    assert c.ledger.total == 0 and c.stats()["credits_released"] == 6


@pytest.mark.parametrize("flt,rewards,kept", [
    ("extreme", [0, 0, 0, 0], False), ("extreme", [1, 1, 1, 1], False), ("extreme", [0, 1, 1, 1], True),
    ("accuracy_window", [1, 0, 0, 0], True),  # 0.25 == acc_lo: inclusive
    ("accuracy_window", [1, 1, 1, 0], True),  # 0.75 == acc_hi: inclusive
    ("accuracy_window", [1, 1, 1, 1], False), ("accuracy_window", [0, 0, 0, 0], False),
    ("none", [0, 0, 0, 0], True),
])
def test_filters(flt, rewards, kept):
    c = core(filter=flt, acc_lo=0.25, acc_hi=0.75)
    acc, reason, _ = c.push("a", wire(make_group("g", rewards=rewards)))
    assert acc == kept
    if not kept:
        assert reason == f"filtered_{flt}" and c.stats()["filtered"] == {flt: 1}
    assert len(c.queue) == int(kept)


def test_demos_attached_and_missing_demo_rejected():
    c = core(filter="extreme")
    demo = np.array([5, 6, 7, 8, 9], np.int32)
    c.add_demos([(3, demo, 1.0)])
    g = make_group("g", rewards=[0, 0, 0, 0], prompt_index=3, meta={"demo_rows": 2})
    acc, reason, _ = c.push("a", wire(g))
    assert (acc, reason) == (True, "ok")  # the teacher rows make the group non-extreme
    out = c.take(1)[0].to_group()
    assert out.n == 6
    assert_same_group(g, type(g)(**{**vars(out), "samples": out.samples[:4]}))
    for s in out.samples[4:]:
        assert s.tokens.tolist() == demo.tolist() and s.prefix_mask.all() and (s.versions == -1).all()
        assert (s.logprobs == 0).all() and s.finish_reason == "demo" and s.reward == 1.0
    assert c.stats()["demo_rows_used"] == 2
    c.request_credit("a", 1, 0)
    acc, reason, msg = c.push("a", wire(make_group("h", prompt_index=4, meta={"demo_rows": 1})))
    assert (acc, reason) == (False, "missing_demo") and "prompt 4" in msg
    assert c.ledger.total == 0 and c.stats()["rejected"] == {"missing_demo": 1}


def test_duplicates_are_not_stored_twice():
    c = core()
    assert c.push("a", wire(make_group("g")))[:2] == (True, "ok")
    assert c.push("a", wire(make_group("g")))[:2] == (True, "duplicate")
    assert len(c.queue) == 1 and c.stats()["duplicates"] == 1
    c.take(1)
    assert c.push("a", wire(make_group("g")))[:2] == (True, "duplicate")  # even after it was served


def test_uncredited_push_is_accepted_until_full():
    c = core(capacity_groups=2)
    assert c.push("a", wire(make_group("g1")))[0] and c.push("a", wire(make_group("g2")))[0]
    assert c.push("a", wire(make_group("g3")))[:2] == (False, "buffer_full")
    assert c.stats()["pushes_without_credit"] == 3


def test_snapshot_round_trip_and_bad_file_leaves_state(tmp_path):
    c = core()
    c.add_demos([(3, np.arange(4), 0.5)])
    groups = [make_group(f"g{i}", seed=i, meta={"demo_rows": 1}) for i in range(3)]
    for g in groups:
        c.push("a", wire(g))
    c.served(c.take(1))
    c.set_version(1)
    path = tmp_path / "snap.msgpack"
    write_snapshot(c, str(path))
    d = core()
    restore_snapshot(d, str(path))
    assert d.version == 1 and [g.group_id for g in d.queue] == ["g1", "g2"]
    for a, b in zip(c.queue, d.queue):
        assert_same_group(a.to_group(), b.to_group())
    assert d.demos[3][0].tolist() == [0, 1, 2, 3] and d.demos[3][1] == 0.5
    assert d.stats()["groups_in"] == 3 and d.push("a", wire(groups[0]))[1] == "duplicate"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(WireError):
        restore_snapshot(d, str(path))
    assert len(d.queue) == 2 and d.version == 1  # untouched


def test_credits_of_silent_clients_expire():
    now = [0.0]
    c = BufferCore(BufferSettings(batch_prompts=4, credit_ttl_s=10), clock=lambda: now[0])
    assert c.request_credit("dead", 4, 0) == 4 and c.request_credit("alive", 4, 0) == 4
    now[0] = 8.0
    c.touch("alive")
    now[0] = 12.0
    assert c.expire_credits() == 4
    assert c.ledger.by_client() == {"alive": 4} and c.stats()["credits_expired"] == 4


def test_settings_from_the_typed_run_config():
    from configs.schema import RunConfig  # the launcher passes these; the buffer itself never imports them

    cfg = RunConfig.model_validate({"buffer": {"max_staleness": 3, "filter": "extreme"}, "learner": {"batch_prompts": 5}})
    s = BufferSettings.from_config(cfg)
    assert (s.max_staleness, s.filter, s.batch_prompts, s.capacity_groups) == (3, "extreme", 5, 256)
    assert BufferSettings.from_config(cfg.buffer, batch_prompts=7).batch_prompts == 7
    with pytest.raises(ValueError, match="buffer.filter"):
        BufferSettings.from_config({"filter": "bogus"})
    with pytest.raises(ValueError, match="unknown keys"):
        BufferSettings.from_config({"buffer": {"max_stalenes": 1}})


def test_generated_rows_are_counted_before_the_filter_and_the_staleness_check():
    """PRIME's paper's metric: accuracy on every rollout before its filter. Four groups of 4 generated rows
    arrive: [1 1 1 1] (filtered: all correct), [1 0 0 0] (kept), [0 0 0 0] at version 0 after the learner reached
    3 (dropped stale on arrival; K = 1), and [1 1 0 0] with 2 demonstration rows of reward 1 attached (kept; the
    demonstrations are not generated). Generated 16, correct 4 + 1 + 0 + 2 = 7; a duplicate counts nothing."""
    c = core(filter="extreme", max_staleness=1)
    c.add_demos([(3, np.arange(5, dtype=np.int32), 1.0)])
    c.set_version(3)
    pushes = [make_group("all", version=3, rewards=[1, 1, 1, 1]), make_group("one", version=3, rewards=[1, 0, 0, 0]),
              make_group("old", version=0, rewards=[0, 0, 0, 0]),
              make_group("demo", version=3, rewards=[1, 1, 0, 0], meta={"demo_rows": 2})]
    assert [c.push("a", wire(g))[1] for g in pushes] == ["filtered_extreme", "ok", "stale", "ok"]
    assert c.push("a", wire(pushes[1]))[1] == "duplicate"
    s = c.stats()
    assert (s["generated_samples"], s["generated_correct"]) == (16, 7)
    assert s["samples_in"] == 4 + 6  # stored rows: the kept groups, demonstrations included
