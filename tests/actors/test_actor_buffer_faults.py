"""The actor against a buffer that says no or goes away: credit back-pressure (it waits in the buffer's
queue, starts no stale work, and resumes when the learner pulls), a frozen buffer (timeouts, re-sends,
dedup) and a killed + restarted buffer (the groups it held are delivered to the new one; nothing is lost)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.actors.conftest import run_config
from tests.actors.helpers import assert_same_group, pull_all, record_sent, wait_for, wait_rollouts

pytestmark = pytest.mark.slow


def test_credit_back_pressure_waits_and_resumes(make_actor, buffers, learner_client):
    # capacity 2 groups, 2 per learner step: the actor may have at most 2 stored/credited at a time
    cfg = run_config(buffer__max_staleness=2, buffer__capacity_groups=2, learner__batch_prompts=2)
    _, address = buffers.start(cfg)
    learner = learner_client(address)
    actor = make_actor(cfg, address)
    sent = record_sent(actor)
    actor.start_rollouts(max_groups=6)
    pulled = []
    for round_ in range(3):
        wait_for(lambda r=round_: len(sent) == 2 * (r + 1), 60,
                 lambda r=round_: f"2 groups in round {r}: {actor.stats()} {learner.stats()}")
        if round_ < 2:  # (after the last round the actor has started all its prompts)
            # the buffer is full: the actor waits in the buffer's queue and starts nothing more
            wait_for(lambda: learner.stats()["pending_credit_requests"] == 1, 10, "a credit request parked")
            asked = actor.stats()["credit_requests"]
            time.sleep(1.2)
            st = actor.stats()
            assert st["groups_started"] == 2 * (round_ + 1) and st["in_flight"] == 0, st
            assert st["credit_requests"] == asked, "the actor polled instead of waiting in the buffer's queue"
        pulled += learner.pull_batch(2, timeout_s=5)
        learner.set_version(round_ + 1)  # a learner step (the actor stays within K = 2 of it)
    actor.stop()
    assert sorted(g.group_id for g in pulled) == sorted(sent)
    bs = learner.stats()
    assert bs["credit_units_denied"] > 0 and bs["pushes_without_credit"] == 0 and bs["rejected_total"] == 0
    assert actor.stats()["credit_wait_s"] > 1.0


def _settings_port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_frozen_buffer_resend_stores_each_group_once(make_actor, buffers, learner_client):
    cfg = run_config(buffer__max_staleness=2)
    proc, address = buffers.start(cfg)
    learner = learner_client(address, timeout_s=20)
    actor = make_actor(cfg, address, buffer_timeout_s=0.5)
    sent = record_sent(actor)
    actor.start_rollouts(max_groups=8)
    wait_for(lambda: len(sent) >= 1, 60, "a first group")
    os.kill(proc.pid, signal.SIGSTOP)  # "network partition": requests pile up unanswered
    try:
        wait_for(lambda: actor.stats()["outbox"] >= 1 and actor.core.link.failures >= 2, 60,
                 "pushes timing out against the frozen buffer")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert wait_rollouts(actor, 60) == 8
    st = actor.stats()
    assert st["outbox"] == 0 and st["resent"] >= 1 and st["reconnects"] >= 1, st
    pulled = pull_all(learner)
    # each group stored exactly once although some were sent several times
    assert sorted(g.group_id for g in pulled) == sorted(sent) and len(sent) == st["groups_started"]
    for g in pulled:
        assert_same_group(sent[g.group_id][0], g)
    bs = learner.stats()
    assert bs["groups_in"] == len(sent)  # stored once each (a re-send that reached it counts as duplicate)
    print(f"\nfrozen buffer: {st['resent']} groups re-sent, {bs['duplicates']} duplicates recognised by the buffer")


def test_killed_and_restarted_buffer_gets_the_held_groups(make_actor, buffers, learner_client):
    cfg = run_config(buffer__max_staleness=2)
    proc, address = buffers.start(cfg)
    actor = make_actor(cfg, address, buffer_timeout_s=0.5)
    sent = record_sent(actor)
    actor.start_rollouts(max_groups=10)
    wait_for(lambda: len(sent) >= 2, 60, "two groups delivered to the first buffer")
    os.kill(proc.pid, signal.SIGSTOP)  # no reply can leave it after this point
    time.sleep(0.3)
    acked_by_first = set(sent)
    proc.kill()
    proc.join(10)
    wait_for(lambda: actor.stats()["outbox"] >= 1, 60, "groups held while the buffer is down")
    held = actor.stats()["outbox"]
    _, address2 = buffers.start(cfg, port=_settings_port(address))  # same address, empty buffer
    assert address2 == address
    assert wait_rollouts(actor, 60) == 10
    st = actor.stats()
    learner = learner_client(address)
    pulled = {g.group_id: g for g in pull_all(learner)}
    produced = set(sent)
    assert len(produced) == st["groups_started"] == 10 and st["outbox"] == 0, st
    assert produced - acked_by_first <= set(pulled) <= produced, "a group was lost or invented"
    assert len(set(pulled) - acked_by_first) >= held
    for gid, g in pulled.items():
        assert_same_group(sent[gid][0], g)
    print(f"\nfirst buffer acked {len(acked_by_first)}, {held} held while down, second got {len(pulled)}; "
          f"reconnects {st['reconnects']}, down {st['buffer_down_s']:.1f} s")
