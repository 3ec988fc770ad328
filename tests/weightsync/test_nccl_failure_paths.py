"""Failure paths of the NCCL weight sync named by review gpu_path_3 (F1, F3, F6, F7, F11), on CPU with vLLM's NCCL
calls replaced by the fakes of tests/weightsync/test_nccl_plane.py and a real control-plane store."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from tests.weightsync.test_nccl_plane import SLACK_S, UID, FakeComm, make_engine
from weightsync.nccl import engine as nccl_engine
from weightsync.nccl.plane import NcclPlane
from weightsync.protocol import WeightSyncError, group_store, key_unformed


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)


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
