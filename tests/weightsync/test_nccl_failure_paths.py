"""Failure paths of the NCCL weight sync named by review gpu_path_3 (F1, F3, F6, F7, F11), on CPU with vLLM's NCCL
calls replaced by the fakes of tests/weightsync/test_nccl_plane.py and a real control-plane store."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from tests.weightsync.test_nccl_plane import SLACK_S, UID, FakeComm, fake_plane, make_engine
from weightsync.nccl import engine as nccl_engine
from weightsync.nccl.plane import NcclPlane
from weightsync.protocol import WeightSyncError, group_store, key_unformed


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)


@pytest.fixture
def engine(monkeypatch, store):
    """An engine joined to a fake communicator (as tests/weightsync/test_nccl_plane.py's), its vLLM receives
    stubbed out."""
    comm = FakeComm()
    monkeypatch.setattr(nccl_engine, "worker_init_process_group", lambda info, parallel_config: comm)
    eng = make_engine()
    plane = NcclPlane(2, tp=1, mint_uid=lambda: UID, control={
        "host": "127.0.0.1", "port": store.port, "prefix": "grp/", "name": "actor-2", "timeout_s": 5.0,
        "connect_timeout_s": 10.0})
    eng.init_transfer_engine(eng.parse_init_info(plane.init_info(2)))
    monkeypatch.setattr("vllm.model_executor.model_loader.reload.initialize_layerwise_reload", lambda model: None)
    monkeypatch.setattr("vllm.model_executor.model_loader.reload.finalize_layerwise_reload", lambda model, cfg: None)
    monkeypatch.setattr(eng._dense, "receive_weights", lambda info: None)
    eng.test_comm = comm
    yield eng
    eng.shutdown()


# ---------------------------------------------------------------------------- F1: a join the learner gave up on
def test_an_engine_join_ends_soon_after_the_learner_gives_up_on_the_group(monkeypatch, store):
    """The worker's rendezvous never completes (a second rank never joins). It held the engine core for
    connect_timeout_s (300 s by default; 5 s here); once the learner's sender marks the group unformed the
    join ends within a poll."""
    gate = threading.Event()
    monkeypatch.setattr(nccl_engine, "worker_init_process_group", lambda info, pc: gate.wait(30) and FakeComm())
    eng = make_engine()
    plane = NcclPlane(1, mint_uid=lambda: UID, control={"host": "127.0.0.1", "port": store.port, "prefix": "g/",
                                                        "connect_timeout_s": 5.0})
    threading.Timer(0.3, group_store(store, "g/").set, (key_unformed(), "only 1 of 2 receivers registered")).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(WeightSyncError, match=r"rank 1: NCCL rendezvous with the learner was cancelled: the "
                                                  r"learner gave up on this group \(only 1 of 2 receivers"):
            eng.init_transfer_engine(eng.parse_init_info(plane.init_info(1)))
        assert time.monotonic() - t0 < 0.3 + 1.0 + SLACK_S / 5
        assert eng._heartbeat is None and eng.communicator is None
    finally:
        gate.set()


def test_a_sender_that_gives_up_on_its_group_marks_it_unformed():
    """The learner's side of the cancel: a connect that fails (no receiver registered in time) and a close
    before the group formed (the driver rebuilds it) both set `unformed`, with the reason."""
    from weightsync.sender import WeightSender

    sender = WeightSender(1, token="tok", connect_timeout_s=0.3)
    with pytest.raises(WeightSyncError, match="only 0 of 1 receivers registered"):
        sender.connect()
    assert sender._store.get(key_unformed()).decode().startswith("only 0 of 1 receivers registered")
    sender.close()

    closed = WeightSender(1, token="tok", connect_timeout_s=30)
    closed.close()
    assert closed._store.get(key_unformed()).decode() == "the sender was closed before its group formed"


def test_rank_0s_rendezvous_ends_when_its_plane_is_aborted():
    """`reset_sender` closes the sender (plane.abort) while rank 0 still waits in the old group's rendezvous
    (`connect_sender` on its second thread): that wait ends at once instead of at connect_timeout_s."""
    gate = threading.Event()
    plane = NcclPlane(1, communicator_factory=lambda uid, rank, world: gate.wait(30) and FakeComm(),
                      mint_uid=lambda: UID)
    plane.init_info(1)
    threading.Timer(0.2, plane.abort).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(WeightSyncError, match="rendezvous .* was cancelled: the plane was aborted"):
            plane.connect(timeout_s=20)
        assert time.monotonic() - t0 < 0.2 + SLACK_S
    finally:
        gate.set()


# ---------------------------------------------------------------------------- F3: a receiver that never enters the push
def test_a_push_is_cancelled_when_a_receiver_never_enters_it_while_the_others_wait(store, monkeypatch):
    """Rank 2's process beats and nacks nothing, but it never enters the broadcast (its actor loop or engine
    core is stalled): rank 1 and the learner waited in it until the deadline (212 s for a 7B model), and then
    nobody was blamed. Each worker now counts itself in `joined/<k>/<r>` as it enters; JOIN_S (0.5 s here)
    after the announcement the push is cancelled naming rank 2."""
    from tests.weightsync.test_nccl_plane import beat, delta_payload
    from weightsync import push_outcome
    from weightsync.protocol import key_joined

    monkeypatch.setattr(push_outcome, "JOIN_S", 0.5)
    comm = FakeComm(stall=True)
    plane = fake_plane([comm], store=store)
    plane.init_info(1)
    plane.connect(timeout_s=5)
    stop = threading.Event()
    beat(store, [1, 2], stop, dead={})
    store.add(key_joined(4, 1), 1)
    t0 = time.monotonic()
    try:
        with pytest.raises(WeightSyncError, match=r"push #4\) was cancelled: rank 2\b.*did not enter push #4 within "
                                                  r"0\.5 s of its announcement while the others wait in it") as caught:
            plane.send(delta_payload(), timeout_s=30)
    finally:
        stop.set()
        plane.abort()
    assert time.monotonic() - t0 < 10
    assert set(caught.value.failed_ranks) == {2}


def test_a_push_nobody_entered_is_left_to_its_deadline(store, monkeypatch):
    """No receiver entered (something every engine shares): blaming all of them would replace the fleet; the
    deadline and the driver's one retry on a rebuilt group handle it."""
    from tests.weightsync.test_nccl_plane import beat
    from weightsync import push_outcome

    monkeypatch.setattr(push_outcome, "JOIN_S", 0.2)
    stop = threading.Event()
    beat(store, [1, 2], stop, dead={})
    probe = push_outcome.push_failure_probe(store, [1, 2], 4, joins=1)
    try:
        time.sleep(0.5)
        assert probe() is None and probe.blamed == {}
    finally:
        stop.set()


def test_an_engine_counts_itself_into_each_push_it_enters(engine, store):
    from tests.weightsync.test_nccl_plane import dense_payload, push
    from weightsync.protocol import key_joined

    push(engine, dense_payload())
    assert group_store(store, "grp/").add(key_joined(3, 2), 0) == 1


# ---------------------------------------------------------------------------- F6: the ring is built at the join
def test_both_ends_build_the_broadcast_ring_while_every_rank_is_in_the_rendezvous(monkeypatch, store):
    """NCCL >= 2.22 connects lazily, and vLLM's warm-up all_reduce of one element may not build the ring that
    broadcast uses: the first push then did NCCL's blocking connection setup inside the broadcast, outside the
    gate, where a transport fault named no receiver. Each end's first operation on a new communicator is now a
    1-element broadcast from rank 0, inside the rendezvous and its deadline."""
    rank0, worker = FakeComm(), FakeComm()
    plane = NcclPlane(1, communicator_factory=lambda uid, rank, world: rank0, mint_uid=lambda: UID)
    plane.init_info(1)
    plane.connect(timeout_s=5)
    monkeypatch.setattr(nccl_engine, "worker_init_process_group", lambda info, pc: worker)
    eng = make_engine()
    control = {"host": "127.0.0.1", "port": store.port, "prefix": "g/", "connect_timeout_s": 5.0}
    eng.init_transfer_engine(eng.parse_init_info(NcclPlane(1, mint_uid=lambda: UID, control=control).init_info(1)))
    try:
        for comm in (rank0, worker):
            assert comm.ops == [(1, 0)]  # (elements, src) of every broadcast so far
    finally:
        eng.shutdown()


# ---------------------------------------------------------------------------- F7: a failed receive drops its group
def test_a_receive_that_fails_without_the_watcher_drops_its_communicator(engine, monkeypatch):
    """A loader error (an unknown tensor name) raised out of the receive while no abort or deadline fired: the
    worker kept a communicator whose collective sequence is broken, although the engine's docstring says a
    failed push leaves none. Now destroyed once (ncclCommAbort), like an aborted one."""
    from tests.weightsync.test_nccl_plane import dense_payload
    from weightsync.nccl.plane import nccl_update_info

    def loader_error(info):
        raise ValueError("no parameter model.x")

    monkeypatch.setattr(engine._dense, "receive_weights", loader_error)
    comm = engine.test_comm
    with pytest.raises(ValueError, match="no parameter model.x"):
        engine.update_weights({"version": 7, "seq": 3, **nccl_update_info(dense_payload())})
    assert engine.communicator is None and comm.destroyed == 1


# ---------------------------------------------------------------------------- F11: what failed generations leave
def test_abandoned_nccl_calls_are_counted_in_the_error():
    """A rendezvous that never forms leaves its thread blocked in ncclCommInitRank (NCCL cannot end it), and
    one more with every failed generation: harmless unless rebuilds fail in a loop, which the count shows."""
    from weightsync.nccl import comm

    gate = threading.Event()
    before = comm.abandoned_calls()
    try:
        for n in (1, 2):
            with pytest.raises(WeightSyncError, match=rf"did not finish within its 0\.1 s deadline \({before + n} "
                                                      r"abandoned NCCL call\(s\) still blocked in this process"):
                comm.call_with_deadline(lambda: gate.wait(30), 0.1, "rendezvous")
        assert comm.abandoned_calls() == before + 2
    finally:
        gate.set()
    deadline = time.monotonic() + 5
    while comm.abandoned_calls() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert comm.abandoned_calls() == before  # they ended: no longer counted
