"""The buffer service end to end: real spawned processes, real ZMQ sockets, real clients."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from buffer.client import BufferClient, BufferRequestError, BufferUnavailable
from buffer.process import start_buffer_process
from tests.buffer.batching_client import BatchingClient
from tests.buffer.helpers import assert_same_group, make_group

ROOT = Path(__file__).resolve().parents[2]


def test_round_trip_through_the_service_is_exact(start_buffer):
    addr = start_buffer(batch_prompts=3)
    groups = [make_group("a", n=4, tokens=33, seed=1), make_group("b", n=1, tokens=1, seed=2, prefix=1),
              make_group("c", n=8, tokens=300, seed=3, prefix=5, meta={"prefix_ratio": 0.25, "tags": ["x"]})]
    with BatchingClient(addr, "actor-0", timeout_s=10) as actor, BatchingClient(addr, "learner", timeout_s=10) as learner:
        assert actor.request_credit(3, 0).granted == 3
        assert [a.accepted for a in actor.push_groups(groups[:2])] == [True, True]
        assert actor.push_group(groups[2]).accepted
        got = learner.pull_batch(3, timeout_s=5)
        for a, b in zip(groups, got):
            assert_same_group(a, b)
        assert learner.last_pull == {"version": 0, "lags": [0, 0, 0], "dropped_stale": 0, "discarded": []}
        s = learner.stats()
        assert (s["groups_in"], s["groups_out"], s["samples_out"], s["occupancy_groups"]) == (3, 3, 13, 0)
        assert s["credits_outstanding"] == 0 and s["lag_hist"] == {"0": 3}
        got[0].samples[0].tokens[0] = 1  # arrays handed to the learner are writable
        with pytest.raises(TimeoutError, match="0 of 1"):
            learner.pull_batch(1, timeout_s=0.2)
        actor.push_group(make_group("d", version=1))
        assert learner.pull_batch(1, timeout_s=1, version=1)[0].group_id == "d"  # set_version + pull
        assert learner.stats()["version"] == 1


def test_k0_runs_synchronously(start_buffer):
    addr = start_buffer(max_staleness=0, batch_prompts=2)
    a1, a2, learner = (BatchingClient(addr, n, timeout_s=10) for n in ("a1", "a2", "learner"))
    assert a1.request_credit(5, 0).granted == 2  # one batch's worth at the current version
    assert a2.request_credit(5, 0).granted == 0
    assert all(a.accepted for a in a1.push_groups([make_group("g1"), make_group("g2")]))
    assert [g.group_id for g in learner.pull_batch(2, 5)] == ["g1", "g2"]
    assert a2.request_credit(5, 0).granted == 0  # that batch is being trained at version 0
    learner.set_version(1)
    c = a2.request_credit(5, 0)
    assert (c.granted, c.learner_version) == (0, 1)  # old weights: load version 1 first
    assert a2.request_credit(5, 1).granted == 2
    ack = a1.push_group(make_group("late", version=0))  # ignoring credit does not get stale work in
    assert (ack.accepted, ack.reason) == (False, "stale")
    s = learner.stats()
    assert s["dropped_stale"] == 1 and s["lag_max"] == 0 and s["credits_by_client"] == {"a2": 2}
    for c in (a1, a2, learner):
        c.close()


def test_set_version_raises_the_bound_for_credit_and_never_lowers_it(start_buffer):
    """max_staleness: auto: the driver's set_version carries the raised bound; an actor one version behind,
    refused at once at K=0, gets credit at K=1; lowering is refused."""
    addr = start_buffer(max_staleness=0, batch_prompts=2)
    actor, learner = (BatchingClient(addr, n, timeout_s=10) for n in ("a1", "learner"))
    learner.set_version(1)
    assert actor.request_credit(5, 0).granted == 0  # behind at K=0
    assert learner.set_version(1, max_staleness=1)["max_staleness"] == 1
    assert actor.request_credit(5, 0).granted == 2  # (K + a - v + 1) * B = 1 * 2
    with pytest.raises(BufferRequestError, match="never lowered"):
        learner.set_version(2, max_staleness=0)
    assert learner.stats()["max_staleness"] == 1
    for c in (actor, learner):
        c.close()


def test_filters_demos_and_missing_demo(start_buffer):
    addr = start_buffer(filter="accuracy_window", acc_lo=0.25, acc_hi=0.75, batch_prompts=1)
    with BatchingClient(addr, "actor", timeout_s=10) as actor, BatchingClient(addr, "learner", timeout_s=10) as learner:
        learner.add_demos({3: np.arange(20, 31), 5: np.array([1, 2])}, rewards={5: 0.0})
        assert (learner.stats()["demos_stored"], learner.stats()["demo_tokens_stored"]) == (2, 11 + 2)
        acks = actor.push_groups([
            make_group("all-wrong", rewards=[0, 0, 0, 0]),
            make_group("all-right", rewards=[1, 1, 1, 1]),
            make_group("edge", rewards=[1, 0, 0, 0]),  # 0.25: inclusive
            make_group("teacher", rewards=[0, 0, 0, 0], prompt_index=3, meta={"demo_rows": 1}),  # 1/5 -> 0.2
            make_group("teacher2", rewards=[0, 0, 0], n=3, prompt_index=3, meta={"demo_rows": 1}),  # 1/4
            make_group("no-demo", prompt_index=4, meta={"demo_rows": 2}),
        ])
        assert [(a.accepted, a.reason) for a in acks] == [
            (False, "filtered_accuracy_window"), (False, "filtered_accuracy_window"), (True, "ok"),
            (False, "filtered_accuracy_window"), (True, "ok"), (False, "missing_demo")]
        assert "prompt 4" in acks[-1].message
        edge, teacher = learner.pull_batch(2, 5)
        assert edge.group_id == "edge" and teacher.n == 4
        demo = teacher.samples[-1]
        assert demo.tokens.tolist() == list(range(20, 31)) and demo.prefix_mask.all() and demo.finish_reason == "demo"
        s = learner.stats()
        assert s["filtered"] == {"accuracy_window": 3} and s["rejected"] == {"missing_demo": 1}
        assert s["demos_stored"] == 2 and s["demo_rows_used"] == 2


def test_duplicate_after_reconnect_keeps_credit(start_buffer):
    addr = start_buffer(batch_prompts=4)
    c1 = BufferClient(addr, "actor-7", timeout_s=10)
    assert c1.request_credit(4, 0).granted == 4
    assert c1.push_group(make_group("g1")).accepted
    c1.close()  # the actor loses its connection; a new socket comes back with the same id
    c2 = BufferClient(addr, "actor-7", timeout_s=10)
    ack = c2.push_group(make_group("g1"))
    assert (ack.accepted, ack.reason) == (True, "duplicate")
    assert c2.push_group(make_group("g2")).accepted
    s = c2.stats()
    assert (s["groups_in"], s["duplicates"], s["occupancy_groups"]) == (2, 1, 2)
    assert s["credits_by_client"] == {"actor-7": 2}
    c2.close()


def test_snapshot_restore_across_processes(start_buffer, tmp_path):
    a = start_buffer()
    groups = [make_group(f"g{i}", seed=i, version=3) for i in range(3)]
    with BatchingClient(a, "learner", timeout_s=10) as c:
        c.add_demos({1: np.arange(5)})
        c.set_version(3, max_staleness=5)  # raised mid-run (max_staleness: auto)
        c.push_groups(groups)
        c.pull_batch(1, 5)
        c.snapshot(str(tmp_path / "buf.msgpack"))
    b = start_buffer()
    with BufferClient(b, "learner", timeout_s=10) as c:
        c.restore(str(tmp_path / "buf.msgpack"))
        s = c.stats()
        assert (s["version"], s["occupancy_groups"], s["groups_in"], s["groups_out"]) == (3, 2, 3, 1)
        assert s["max_staleness"] == 5  # the raised bound came back, not the new process's configured one
        assert c.push_group(groups[1]).reason == "duplicate"
        for x, y in zip(groups[1:], c.pull_batch(2, 5)):
            assert_same_group(x, y)
        assert (s["demos_stored"], s["demo_tokens_stored"]) == (1, 5)  # the demonstration came back too
        with pytest.raises(BufferRequestError) as e:
            c.restore(str(tmp_path / "missing.msgpack"))
        assert e.value.reason == "bad_snapshot"


def test_errors_are_structured_replies_and_a_dead_buffer_is_reported(start_buffer, tmp_path):
    addr = start_buffer(capacity_groups=4)
    c = BufferClient(addr, "learner", timeout_s=1.0)
    c.set_version(2)
    t = time.monotonic()
    with pytest.raises(BufferRequestError, match="never go back") as e:
        c.set_version(1)
    assert e.value.reason == "bad_value"
    with pytest.raises(BufferRequestError, match="capacity_groups=4"):
        c.pull_batch(5, timeout_s=10)
    assert time.monotonic() - t < 1.0  # answered, not timed out
    with pytest.raises(ValueError, match="client_id"):
        BufferClient(addr, "")
    proc = start_buffer.procs[-1]
    proc.terminate()
    proc.join(10)
    t = time.monotonic()
    with pytest.raises(BufferUnavailable, match="did not answer 'stats' within 1.0s"):
        c.stats()
    assert 0.9 < time.monotonic() - t < 5
    port = int(addr.rsplit(":", 1)[1])  # a buffer restarted at the same address is picked up transparently
    log = tmp_path / "buffer.log"  # and its output goes where it is told (a run's logs/buffer.log)
    proc2, addr2 = start_buffer_process(None, port=port, log_path=str(log), log_level="INFO")
    try:
        assert addr2 == addr and c.stats()["version"] == 0
    finally:
        proc2.terminate()
        proc2.join(10)
        c.close()
    assert f"buffer listening on {addr}" in log.read_text()


def test_command_line_entry_point(tmp_path):
    cfg = tmp_path / "buffer.json"
    cfg.write_text(json.dumps({"buffer": {"max_staleness": 2, "filter": "extreme"}, "learner": {"batch_prompts": 4}}))
    p = subprocess.Popen([sys.executable, "-m", "tests.buffer.service_cli", "--config", str(cfg), "--log-level", "WARNING"],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        address = json.loads(p.stdout.readline())["address"]
        with BufferClient(address, "cli-test", timeout_s=10) as c:
            s = c.stats()
            assert (s["max_staleness"], s["batch_prompts"]) == (2, 4)
            assert c.request_credit(100, 0).granted == 12  # (K + 1) * B
    finally:
        p.terminate()
        assert p.wait(10) == 0
    bad = subprocess.run([sys.executable, "-m", "tests.buffer.service_cli", "--filter", "none", "--port", "-1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "buffer.port" in bad.stderr


def test_batched_push_acks_each_group_and_keeps_credit_exact(start_buffer):
    addr = start_buffer(batch_prompts=4, max_staleness=0)
    with BatchingClient(addr, "actor", timeout_s=10) as c:
        assert c.request_credit(4, 0).granted == 4
        bad = make_group("bad")
        bad.samples[1].logprobs[2] = np.inf  # only the buffer's checks see this
        short = make_group("short")
        short.samples[0].versions = short.samples[0].versions[:-1]  # the encoder refuses this one
        acks, credit = c.push_and_request_credit([make_group("g1"), bad, short, make_group("g2")], 4, 0)
        assert [(a.accepted, a.reason) for a in acks] == [
            (True, "ok"), (False, "non_finite"), (False, "length_mismatch"), (True, "ok")]
        assert "samples[1]" not in acks[1].message and "logprobs" in acks[1].message
        assert credit.granted == 2  # B - stored: the two refused groups gave their credit back
        s = c.stats()
        assert (s["credits_outstanding"], s["pushes_without_credit"], s["rejected"]) == (2, 0, {"non_finite": 1})


def test_random_interleavings_through_the_service_never_serve_stale_rows(start_buffer):
    k, b = 1, 2
    addr = start_buffer(max_staleness=k, batch_prompts=b, capacity_groups=12)
    rng = np.random.default_rng(7)
    actors = [BufferClient(addr, f"actor-{i}", timeout_s=10) for i in range(3)]
    learner = BufferClient(addr, "learner", timeout_s=10)
    weights, credit, version, served, n = [0, 0, 0], [0, 0, 0], 0, 0, 0
    for _ in range(300):
        op, i = rng.integers(5), rng.integers(3)
        if op == 0:
            c = actors[i].request_credit(int(rng.integers(1, 4)), weights[i])
            credit[i] += c.granted
        elif op == 1 and (credit[i] or rng.random() < 0.2):  # sometimes a push without credit
            credit[i] = max(0, credit[i] - 1)
            n += 1
            lag = int(rng.integers(0, 3))  # slow generations finish with older weights than the learner's
            actors[i].push_group(make_group(f"g{n}", n=2, tokens=4, version=max(0, weights[i] - lag)))
        elif op == 2:
            weights[i] = version
        elif op == 3:
            try:
                groups = learner.pull_batch(b, timeout_s=0)
            except TimeoutError:
                continue
            for g in groups:
                assert version - g.oldest_version() <= k, (g.group_id, version, g.oldest_version())
            served += len(groups)
            version += 1
            learner.set_version(version)
    s = learner.stats()
    assert served == s["groups_out"] > 10 and s["lag_max"] <= k and s["dropped_stale"] > 0  # the bound did bite
    assert s["groups_in"] == s["groups_out"] + s["occupancy_groups"] + sum(
        v for r, v in s["dropped"].items() if r != "stale_on_arrival")
    for c in [*actors, learner]:
        c.close()


def test_credit_requests_can_wait_for_room_instead_of_polling(start_buffer):
    import threading

    addr = start_buffer(max_staleness=1, batch_prompts=1)
    a1, a2 = BatchingClient(addr, "a1", timeout_s=10), BatchingClient(addr, "a2", timeout_s=10)
    learner = BufferClient(addr, "learner", timeout_s=10)
    assert a1.request_credit(10, 0).granted == 2  # (K + 1) * B
    result = {}
    t = threading.Thread(target=lambda: result.update(c=a2.request_credit(1, 0, wait_s=20), t=time.monotonic()))
    t.start()
    time.sleep(0.3)
    assert "c" not in result  # parked: nothing to grant yet
    t0 = time.monotonic()
    a1.release_credit(1)  # room appears: the parked request is answered at once
    t.join(10)
    assert result["c"].granted == 1 and result["t"] - t0 < 2
    assert learner.stats()["credits_by_client"] == {"a1": 1, "a2": 1}
    a1.push_group(make_group("g", version=0))
    learner.pull_batch(1, 5)
    learner.set_version(2)  # version 0 is now more than K behind: waiting cannot help, so no wait
    t0 = time.monotonic()
    c = a2.request_credit(1, 0, wait_s=20)
    assert (c.granted, c.learner_version) == (0, 2) and time.monotonic() - t0 < 2
    acks, c = a2.push_and_request_credit([], 5, 2, wait_s=20)
    assert c.granted == 1  # (K + 1) * B minus a2's own unit still in flight
    for c in (a1, a2, learner):
        c.close()
