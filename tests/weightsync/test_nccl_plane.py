"""The NCCL data plane's own logic, on CPU: rank plan, init and update payloads, bucket plan, the
deadline on a stalled peer (fake communicator), and the worker engine's dispatch with vLLM's NCCL
calls replaced. Nothing here talks NCCL; the one ``gpu`` test only mints a real unique id."""

import base64
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.device_communicators import pynccl_wrapper
from vllm.distributed.weight_transfer import packed_tensor
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, decode_nccl_unique_id
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo
from vllm.distributed.weight_transfer.sparse_nccl_engine import SparseNCCLWeightTransferUpdateInfo

from weightsync import push_outcome
from weightsync.backends import NCCL_ENGINE_BACKEND
from weightsync.nccl import engine as nccl_engine
from weightsync.nccl import plane as nccl_plane
from weightsync.nccl.engine import ImpalaNcclWeightTransferEngine, dense_update_info, sparse_update_infos
from weightsync.nccl.plane import (
    NCCL_UNIQUE_ID_BYTES,
    NcclPlane,
    bucket_plan,
    encode_unique_id,
    group_world_size,
    mint_unique_id,
    nccl_init_info,
    nccl_update_info,
    rank_offset,
)
from weightsync.packing import Patch
from weightsync.plane import Payload, PlaneContext
from weightsync.protocol import (
    ABORTED_BY_SENDER,
    WeightSyncError,
    group_store,
    key_abort,
    key_heartbeat,
    key_worker,
    post_nack,
)

UID = bytes(range(NCCL_UNIQUE_ID_BYTES))
SHORT_B64 = base64.b64encode(UID[:127]).decode()  # valid base64 of one byte too few
SLACK_S = 5.0  # generous: the machine is shared; the point is "returns", not "returns fast"


class FakeComm:
    """Records broadcasts; with ``stall`` every broadcast after the join's 1-element warm-up blocks like a peer that never shows up,
    until ``destroy`` (as ncclCommAbort ends stuck kernels) or, with ``abort_unblocks=False``, until
    the test's ``release``."""

    def __init__(self, stall: bool = False, abort_unblocks: bool = True):
        self.device = torch.device("cpu")
        self.ops: list[tuple[int, int]] = []  # (elements, src) of every broadcast, the ring's warm-up included
        self.sent: list[torch.Tensor] = []  # what was broadcast after the warm-up (the payload)
        self.destroyed = 0
        self.after_destroy = 0  # broadcasts issued once destroy began (undefined on a real communicator)
        self.stall, self.abort_unblocks = stall, abort_unblocks
        self.release = threading.Event()

    def broadcast(self, tensor, src, stream=None):
        assert src == 0
        self.ops.append((tensor.numel(), src))
        if len(self.ops) == 1 and tensor.numel() == 1:  # the ring's warm-up at the join (F6): every rank is there
            return
        self.after_destroy += self.destroyed > 0
        self.sent.append(tensor.clone())
        if self.stall:
            self.release.wait(60)

    def destroy(self):
        self.destroyed += 1
        if self.abort_unblocks:
            self.release.set()


def fake_plane(comms: list, num_receivers: int = 2, **kw) -> NcclPlane:
    """A plane whose rendezvous hands out ``comms`` in turn and whose ids count up from 1."""
    minted = iter(range(1, 100))
    return NcclPlane(num_receivers, communicator_factory=lambda uid, rank, world: comms.pop(0),
                     mint_uid=lambda: bytes([next(minted)]) * NCCL_UNIQUE_ID_BYTES, **kw)


def dense_payload() -> Payload:
    return Payload(version=7, seq=3, patches=None,
                   full=[("a.weight", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b.bias", torch.ones(4))])


def delta_payload() -> Payload:
    return Payload(version=8, seq=4, full=None, patches=[
        Patch("a.weight", torch.tensor([0, 5], dtype=torch.int32),
              torch.tensor([1.0, 2.0], dtype=torch.bfloat16), (2, 3)),
        Patch("b.bias", torch.tensor([3], dtype=torch.int32), torch.tensor([4.0]), (4,)),
    ])


# ---------------------------------------------------------------------------- rank plan
@pytest.mark.parametrize("n", [1, 2, 32])
@pytest.mark.parametrize("tp", [1, 2])
def test_rank_offsets_partition_the_worker_ranks(n, tp):
    world = group_world_size(n, tp)
    assert world == 1 + n * tp
    offsets = [rank_offset(r, n, tp) for r in range(1, n + 1)]
    assert offsets == [1 + (r - 1) * tp for r in range(1, n + 1)]
    # every worker rank 1..world-1 is held by exactly one engine; rank 0 is the learner's
    held = [o + w for o in offsets for w in range(tp)]
    assert sorted(held) == list(range(1, world))


def test_rank_plan_goldens_and_refusals():
    assert (group_world_size(32, 2), rank_offset(32, 32, 2)) == (65, 63)  # 1 + 32*2; 1 + 31*2
    assert [rank_offset(r, 3, 4) for r in (1, 2, 3)] == [1, 5, 9]  # 1 + (r-1)*4
    for bad in [(0, 2, 1), (3, 2, 1), (1, 2, 0)]:
        with pytest.raises(ValueError):
            rank_offset(*bad)


# ---------------------------------------------------------------------------- init payloads
def test_unique_id_round_trips_through_vllm_and_refuses_wrong_length():
    assert NCCL_UNIQUE_ID_BYTES == pynccl_wrapper.NCCL_UNIQUE_ID_BYTES
    b64 = encode_unique_id(UID)
    assert decode_nccl_unique_id(master_address=None, master_port=None, nccl_unique_id_b64=b64, ctx="t") == UID
    with pytest.raises(ValueError, match="128 bytes, got 127"):
        encode_unique_id(UID[:127])
    short = dict(nccl_init_info(1, 1, 1, UID, 64, 2), nccl_unique_id_b64=SHORT_B64)
    with pytest.raises(ValueError, match="must decode to 128"):
        NCCLWeightTransferInitInfo(**short)


def test_init_payload_golden():
    # 128 zero bytes = 42 groups of 3 bytes ("AAAA" each) + 2 bytes ("AAA=") -> 171 x "A" + "="
    nccl = {"rank_offset": 3, "world_size": 7,  # 1 + (2-1)*2; 1 + 3*2
            "nccl_unique_id_b64": "A" * 171 + "=",
            "packed": True, "packed_buffer_size_bytes": 1024, "packed_num_buffers": 3}
    assert nccl_init_info(2, 3, 2, bytes(128), 1024, 3) == nccl
    control = {"host": "10.0.0.1", "port": 29500, "prefix": "group/ab", "timeout_s": 60.0,
               "connect_timeout_s": 300.0}
    plane = NcclPlane(3, tp=2, packed_buffer_bytes=1024, num_buffers=3, control=control,
                      mint_uid=lambda: bytes(128))
    assert plane.init_info(2) == {**control, "rank": 2, **nccl}  # what the receiver passes on unchanged


def test_one_unique_id_per_generation():
    comms = [FakeComm(), FakeComm()]
    plane = fake_plane(list(comms))
    first = [plane.init_info(r)["nccl_unique_id_b64"] for r in (1, 2)]
    assert first[0] == first[1] == encode_unique_id(bytes([1]) * 128)
    plane.connect(timeout_s=5)
    plane.connect(timeout_s=5)  # connected, no new generation: nothing happens
    assert comms[0].destroyed == 0
    second = plane.init_info(1)["nccl_unique_id_b64"]
    assert second == encode_unique_id(bytes([2]) * 128)  # a consumed id is never handed out again
    plane.connect(timeout_s=5)
    assert comms[0].destroyed == 1 and comms[1].destroyed == 0  # re-init destroyed the previous one
    plane.abort()
    plane.abort()
    assert comms[1].destroyed == 1
    with pytest.raises(RuntimeError, match="before init_info"):
        plane.connect(timeout_s=5)


def test_rendezvous_deadline_and_late_communicator_destroyed():
    late = FakeComm()
    gate = threading.Event()

    def slow_join(uid, rank, world):
        gate.wait(30)
        return late

    plane = NcclPlane(1, communicator_factory=slow_join, mint_uid=lambda: UID)
    plane.init_info(1)
    with pytest.raises(WeightSyncError, match="rendezvous .* deadline"):
        plane.connect(timeout_s=0.2)
    gate.set()  # the join completes after all: nobody wants it
    for _ in range(100):
        if late.destroyed:
            break
        time.sleep(0.05)
    assert late.destroyed == 1


# ---------------------------------------------------------------------------- update payloads
def test_update_payload_goldens():
    assert nccl_update_info(dense_payload()) == {
        "kind": "full", "names": ["a.weight", "b.bias"], "dtype_names": ["bfloat16", "float32"],
        "shapes": [[2, 3], [4]]}
    assert nccl_update_info(delta_payload()) == {
        "kind": "delta", "names": ["a.weight", "b.bias"], "dtype_names": ["bfloat16", "float32"],
        "shapes": [[2, 3], [4]], "num_updates_list": [2, 1]}


def test_update_payloads_parse_as_vllm_infos():
    engine = make_engine()
    dense = engine.parse_update_info({"version": 7, "seq": 3, **nccl_update_info(dense_payload())})
    assert dense_update_info(dense) == NCCLWeightTransferUpdateInfo(
        names=["a.weight", "b.bias"], dtype_names=["bfloat16", "float32"], shapes=[[2, 3], [4]])
    delta = engine.parse_update_info({"version": 8, "seq": 4, **nccl_update_info(delta_payload())})
    assert sparse_update_infos(delta) == [SparseNCCLWeightTransferUpdateInfo(
        names=["a.weight", "b.bias"], dtype_names=["bfloat16", "float32"], shapes=[[2, 3], [4]],
        num_updates_list=[2, 1])]
    empty = engine.parse_update_info({"version": 9, "seq": 5, **nccl_update_info(
        Payload(version=9, seq=5, full=None, patches=[]))})
    assert sparse_update_infos(empty) == []
    with pytest.raises(ValueError, match="kind"):
        engine.parse_update_info({"version": 1, "seq": 1, "kind": "sparse", "names": [], "dtype_names": [],
                                  "shapes": []})


@pytest.mark.parametrize("patch, why", [
    (Patch("w", torch.tensor([0]), torch.tensor([1.0]), (2,)), "int32"),  # int64 indices
    (Patch("w", torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1.0]), (2,)), "2 indices but 1"),
    (Patch("w", torch.tensor([0], dtype=torch.int32), torch.tensor([1]), (2,)), "floating"),
])
def test_malformed_patches_refused_before_sending(patch, why):
    with pytest.raises(ValueError, match=why):
        nccl_update_info(Payload(version=1, seq=1, full=None, patches=[patch]))


# ---------------------------------------------------------------------------- bucket plan
def test_bucket_plan_goldens():
    # 40 | +30 = 70 > 64 closes [0,1]; 50, +10 = 60, +100 = 160 > 64 closes [2,3,4]; 5 is left over
    assert bucket_plan([40, 30, 50, 10, 100, 5], 64) == [[0, 1], [2, 3, 4], [5]]
    # 32 + 32 = 64 is not > 64, so the bucket stays open for the third
    assert bucket_plan([32, 32, 1], 64) == [[0, 1, 2]]
    assert bucket_plan([], 64) == []


@pytest.mark.filterwarnings("ignore:Tensor .* exceeds buffer_size_bytes")
def test_bucket_plan_is_vllms_chunking():
    sizes = [40, 30, 50, 10, 100, 5, 64, 65, 1]
    named = [(f"t{i}", torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate(sizes)]
    it = iter(named)
    chunks = []
    while (c := packed_tensor.pack_tensors(it, lambda item: item[1], 64)) is not None:
        chunks.append([int(n[1:]) for n in c.names])
    assert chunks == bucket_plan(sizes, 64)


# ---------------------------------------------------------------------------- send
@pytest.mark.filterwarnings("ignore:Tensor .* exceeds buffer_size_bytes")
def test_dense_send_uses_vllms_producer_and_reports_its_buckets(monkeypatch):
    seen = {}

    def producer(iterator, group, src, post_iter_func, buffer_size_bytes, num_buffers):
        # vLLM's producer without its CUDA streams: the same packing, one broadcast per chunk
        seen.update(buffer_size_bytes=buffer_size_bytes, num_buffers=num_buffers)
        while (chunk := packed_tensor.pack_tensors(iterator, post_iter_func, buffer_size_bytes)) is not None:
            group.broadcast(chunk.packed_tensor, src=src)

    monkeypatch.setattr(packed_tensor, "packed_nccl_broadcast_producer", producer)
    comm = FakeComm()
    plane = fake_plane([comm], packed_buffer_bytes=12, num_buffers=3)
    plane.init_info(1)
    plane.connect(timeout_s=5)
    stats = plane.send(dense_payload(), timeout_s=10)
    # a.weight: 6 bf16 = 12 bytes (not > 12), + b.bias 16 bytes = 28 > 12: one bucket of 28 bytes
    assert stats == {"bytes": 28, "buckets": 1, "tensors": 2}
    assert seen == {"buffer_size_bytes": 12, "num_buffers": 3}
    assert [t.numel() for t in comm.sent] == [28]
    assert comm.destroyed == 0


def test_delta_send_order_and_stats():
    comm = FakeComm()
    plane = fake_plane([comm])
    plane.init_info(1)
    plane.connect(timeout_s=5)
    stats = plane.send(delta_payload(), timeout_s=10)
    # bytes: 2 int32 + 2 bf16 = 12, 1 int32 + 1 fp32 = 8; two broadcasts per patch
    assert stats == {"bytes": 20, "buckets": 4, "tensors": 2}
    assert [t.tolist() for t in comm.sent] == [[0, 5], [1.0, 2.0], [3], [4.0]]  # indices, values per patch


@pytest.mark.parametrize("abort_unblocks", [True, False])
def test_stalled_peer_raises_within_deadline_and_aborts(abort_unblocks):
    comm = FakeComm(stall=True, abort_unblocks=abort_unblocks)
    plane = fake_plane([comm])
    plane.init_info(1)
    plane.connect(timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"push #4\) did not finish within its 0.3 s deadline \(\d+ abandoned "
                                              r"NCCL call\(s\) still blocked in this process\); NCCL communicator aborted"):
        plane.send(delta_payload(), timeout_s=0.3)
    assert time.monotonic() - t0 < 0.3 + SLACK_S
    assert comm.destroyed == 1
    with pytest.raises(WeightSyncError, match="not connected"):
        plane.send(delta_payload(), timeout_s=0.3)
    senders = [t for t in threading.enumerate() if t.name.startswith("weightsync-nccl: NCCL broadcast")]
    if abort_unblocks:  # the abort ended the stuck call: the send thread finishes on its own
        for t in senders:
            t.join(SLACK_S)
        assert not any(t.is_alive() for t in senders)
    else:  # NCCL never returns: the thread is left behind, a daemon, and the caller was not held
        assert senders and all(t.daemon for t in senders)
        comm.release.set()


def test_abort_from_another_thread_ends_the_send():
    comm = FakeComm(stall=True)
    plane = fake_plane([comm])
    plane.init_info(1)
    plane.connect(timeout_s=5)
    threading.Timer(0.2, plane.abort).start()
    with pytest.raises(WeightSyncError, match="was aborted"):
        plane.send(delta_payload(), timeout_s=60)
    assert comm.destroyed == 1


# ---------------------------------------------------------------------------- worker engine
def make_engine() -> ImpalaNcclWeightTransferEngine:
    vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(world_size=1, rank=0, data_parallel_index=0),
                                  model_config=None)
    return ImpalaNcclWeightTransferEngine(WeightTransferConfig(backend=NCCL_ENGINE_BACKEND), vllm_config,
                                          torch.device("cpu"), torch.nn.Linear(2, 2))


@pytest.fixture
def store():
    s = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    yield s


@pytest.fixture
def engine(monkeypatch, store):
    """An engine joined to a fake communicator, registered with a real control-plane store."""
    comm = FakeComm()
    joins = []
    monkeypatch.setattr(nccl_engine, "worker_init_process_group",
                        lambda info, parallel_config: joins.append(info) or comm)
    eng = make_engine()
    plane = NcclPlane(2, tp=1, packed_buffer_bytes=4096, num_buffers=3, mint_uid=lambda: UID, control={
        "host": "127.0.0.1", "port": store.port, "prefix": "grp/", "name": "actor-2", "timeout_s": 0.5,
        "connect_timeout_s": 10.0})
    eng.init_transfer_engine(eng.parse_init_info(plane.init_info(2)))
    eng.test_comm, eng.test_joins = comm, joins
    yield eng
    eng.shutdown()


def test_engine_init_joins_registers_and_beats(engine, store):
    (info,) = engine.test_joins
    assert (info.rank_offset, info.world_size, info.nccl_unique_id_bytes) == (2, 3, UID)  # 1+(2-1)*1; 1+2*1
    assert (engine._dense.packed, engine._dense.packed_buffer_size_bytes, engine._dense.packed_num_buffers) == (
        True, 4096, 3)
    assert engine._sparse.model_update_group is engine.communicator and engine.communicator.comm is engine.test_comm
    g = group_store(store, "grp/")
    assert g.check([key_worker(2)])
    deadline = time.monotonic() + 10
    while g.add(key_heartbeat(2), 0) < 2:
        assert time.monotonic() < deadline, "no heartbeat from the engine"
        time.sleep(0.05)
    comm = engine.test_comm
    engine.init_transfer_engine(engine._info)  # re-init destroys the previous communicator
    assert comm.destroyed == 1


def test_engine_rendezvous_deadline(monkeypatch, store):
    late, gate = FakeComm(), threading.Event()
    monkeypatch.setattr(nccl_engine, "worker_init_process_group", lambda info, pc: gate.wait(30) and late)
    eng = make_engine()
    plane = NcclPlane(1, mint_uid=lambda: UID, control={"host": "127.0.0.1", "port": store.port, "prefix": "g/",
                                                        "connect_timeout_s": 0.3})
    with pytest.raises(WeightSyncError, match="rank 1: NCCL rendezvous with the learner did not finish"):
        eng.init_transfer_engine(eng.parse_init_info(plane.init_info(1)))
    assert eng._heartbeat is None and eng.communicator is None  # no group: no longer reported alive
    gate.set()
    for _ in range(100):
        if late.destroyed:
            break
        time.sleep(0.05)
    assert late.destroyed == 1


def test_engine_refuses_tcp_rendezvous():
    fields = {"host": "h", "port": 1, "prefix": "p", "rank": 1, "rank_offset": 1, "world_size": 2}
    with pytest.raises(ValueError, match="only with nccl_unique_id_b64"):
        make_engine().parse_init_info({**fields, "master_address": "h", "master_port": 2})
    with pytest.raises(ValueError, match="must decode to 128"):
        make_engine().parse_init_info({**fields, "nccl_unique_id_b64": SHORT_B64})


@pytest.fixture
def calls(monkeypatch, engine):
    """What the engine asks of vLLM: layerwise reload start/finish, dense and sparse receives."""
    log = []
    monkeypatch.setattr("vllm.model_executor.model_loader.reload.initialize_layerwise_reload",
                        lambda model: log.append("reload"))
    monkeypatch.setattr("vllm.model_executor.model_loader.reload.finalize_layerwise_reload",
                        lambda model, model_config: log.append("finalize"))
    monkeypatch.setattr(engine._dense, "receive_weights", lambda info: log.append(("dense", info)))
    monkeypatch.setattr(engine._sparse, "receive_weights", lambda info: log.append(("sparse", info)))
    monkeypatch.setattr(engine, "_abandon_reload", lambda: log.append("abandon"))
    return log


def push(engine, payload: Payload) -> None:
    """The vLLM worker's sequence for one push."""
    engine.start_weight_update()
    engine.update_weights({"version": payload.version, "seq": payload.seq, **nccl_update_info(payload)})
    engine.finish_weight_update()


def test_engine_full_push_reloads_and_uses_vllms_dense_receive(engine, calls):
    push(engine, dense_payload())
    assert calls == ["reload", ("dense", NCCLWeightTransferUpdateInfo(
        names=["a.weight", "b.bias"], dtype_names=["bfloat16", "float32"], shapes=[[2, 3], [4]])), "finalize"]


def test_engine_delta_push_is_in_place(engine, calls):
    push(engine, delta_payload())
    push(engine, Payload(version=9, seq=5, full=None, patches=[]))  # nothing changed: nothing to receive
    assert calls == [("sparse", SparseNCCLWeightTransferUpdateInfo(
        names=["a.weight", "b.bias"], dtype_names=["bfloat16", "float32"], shapes=[[2, 3], [4]],
        num_updates_list=[2, 1]))]


def test_engine_adapter_push_writes_the_adapter_and_loads_nothing(engine, calls, monkeypatch, tmp_path):
    """A LoRA adapter push (`adapter_dir`): vLLM's dense receive runs as for a full push, but what it would feed
    the model's load_weights is written to adapter_dir/adapter_model.safetensors; no layerwise reload starts."""
    from safetensors.torch import load_file

    payload = dense_payload()
    sent = dict(payload.full)

    def receive(info):  # vLLM's packed consumer: the received tensors go to model.load_weights, views of a buffer
        calls.append(("dense", info))
        engine._dense.model.load_weights([(n, sent[n].clone()) for n in info.names])

    monkeypatch.setattr(engine._dense, "receive_weights", receive)
    model = engine._dense.model
    engine.start_weight_update()
    engine.update_weights({"version": 7, "seq": 3, **nccl_update_info(payload), "adapter_dir": str(tmp_path)})
    engine.finish_weight_update()
    assert [c if isinstance(c, str) else c[0] for c in calls] == ["dense"]  # no "reload", no "finalize"
    assert engine._dense.model is model  # the stand-in collector is gone again
    written = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert written.keys() == sent.keys() and all(torch.equal(written[k], sent[k]) for k in sent)


def test_engine_failed_full_push_rolls_the_reload_back(engine, calls, monkeypatch):
    def broken(info):
        raise RuntimeError("NCCL error")

    monkeypatch.setattr(engine._dense, "receive_weights", broken)
    engine.start_weight_update()
    with pytest.raises(RuntimeError, match="NCCL error"):
        engine.update_weights({"version": 7, "seq": 3, **nccl_update_info(dense_payload())})
    assert calls == ["reload", "abandon"]


@pytest.mark.parametrize("cause", ["sender abort", "deadline"])
def test_engine_stuck_receive_is_aborted(engine, calls, monkeypatch, store, cause):
    comm = engine.test_comm
    monkeypatch.setattr(engine._dense, "receive_weights", lambda info: comm.release.wait(60))
    if cause == "sender abort":
        group_store(store, "grp/").set(key_abort(3), "rank 1 stalled")
        expected = f"{ABORTED_BY_SENDER}: rank 1 stalled"
    else:  # timeout_s 0.5 + grace 0
        monkeypatch.setattr(nccl_engine, "RECEIVER_GRACE_S", 0.0)
        expected = "push #3 not received within 0.5 s"
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=f"rank 2: {expected}; NCCL communicator aborted"):
        engine.update_weights({"version": 7, "seq": 3, **nccl_update_info(dense_payload())})
    assert time.monotonic() - t0 < 0.5 + SLACK_S
    assert comm.destroyed == 1 and engine.communicator is None
    assert calls == ["reload", "abandon"]
    with pytest.raises(RuntimeError, match="not initialised"):
        engine.update_weights({"version": 8, "seq": 4, **nccl_update_info(delta_payload())})


def test_plugin_registers_the_engine():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from weightsync.plugin import register

    register()
    register()  # idempotent
    assert NCCL_ENGINE_BACKEND in WeightTransferEngineFactory._registry


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (libnccl)")
def test_real_unique_id_reaches_vllms_init_info():
    uid = mint_unique_id()
    assert len(uid) == NCCL_UNIQUE_ID_BYTES
    assert NCCLWeightTransferInitInfo(**nccl_init_info(1, 1, 1, uid, 64, 2)).nccl_unique_id_bytes == uid


# ---------------------------------------------------------------------------- deadline by size
def test_the_push_deadline_grows_with_its_bytes(monkeypatch):
    """deadline = timeout_s + bytes / min_gbps (GB/s): at 0.001 GB/s (1 MB/s) a 1 MB push gets 1 s
    more than the base, a 3 MB one 3 s; the receivers are told the same deadline."""
    plane = fake_plane([FakeComm()], num_receivers=1, min_gbps=0.001, control={"timeout_s": 10.0})
    plane.init_info(1)
    plane.connect(timeout_s=5)
    seen = []
    real = nccl_plane.call_with_deadline
    monkeypatch.setattr(nccl_plane, "call_with_deadline",
                        lambda fn, timeout_s, what, **kw: seen.append(timeout_s) or real(fn, timeout_s, what, **kw))
    monkeypatch.setattr(packed_tensor, "packed_nccl_broadcast_producer", lambda **kw: None)
    infos, sizes = [], []
    for nbytes in (1_000_000, 3_000_000):
        payload = Payload(version=1, seq=1, full=[("w", torch.zeros(nbytes // 2, dtype=torch.bfloat16))])
        sizes.append(plane.send(payload, timeout_s=10.0)["bytes"])
        infos.append(plane.update_info(payload)["deadline_s"])
    assert sizes == [1_000_000, 3_000_000]
    assert seen == infos == [pytest.approx(11.0), pytest.approx(13.0)]
    with pytest.raises(ValueError, match="min_gbps"):
        NcclPlane(1, min_gbps=0)


def test_engine_watches_the_push_for_the_senders_deadline(engine, calls, monkeypatch):
    """The init's timeout_s is 0.5 s; a push announced with deadline_s 1.5 is watched for 1.5 s."""
    comm = engine.test_comm
    monkeypatch.setattr(engine._dense, "receive_weights", lambda info: comm.release.wait(60))
    monkeypatch.setattr(nccl_engine, "RECEIVER_GRACE_S", 0.0)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="push #3 not received within 1.5 s"):
        engine.update_weights({"version": 7, "seq": 3, **nccl_update_info(dense_payload()), "deadline_s": 1.5})
    assert 1.5 <= time.monotonic() - t0 < 1.5 + SLACK_S


# ---------------------------------------------------------------------------- N7: dtypes
@pytest.mark.parametrize("payload, name", [
    (Payload(version=1, seq=1, full=[("a.weight", torch.zeros(2)), ("model.not_sendable",
                                                                      torch.zeros(2, dtype=torch.complex64))]),
     "model.not_sendable"),
    (Payload(version=1, seq=1, full=None, patches=[Patch("w8", torch.tensor([0], dtype=torch.int32),
                                                         torch.zeros(1, dtype=torch.float8_e4m3fn), (2,))]),
     "w8"),
])
def test_a_dtype_gloo_could_not_send_is_refused_before_the_push_is_announced(payload, name):
    """vLLM's packed producer sends any dtype as bytes (complex64 included): the push would fail only in
    every engine's loader, after they all paused. Refused here, as gloo's packer refuses it, naming the
    tensor; ``update_info`` runs before the announcement (``WeightSender.send``)."""
    with pytest.raises(TypeError, match=f"tensor '{name}': dtype torch.* cannot be sent; supported: "):
        fake_plane([FakeComm()]).update_info(payload)


# ---------------------------------------------------------------------------- N5: the gate
def test_a_send_woken_by_the_abort_never_broadcasts_again():
    """The deadline destroys the communicator; like ncclCommAbort, that ends the stalled broadcast and
    the abandoned send thread goes on with the next patch. It must not reach the communicator again
    (on a real one: a broadcast on a communicator being aborted or freed)."""
    comm = FakeComm(stall=True)
    plane = fake_plane([comm])
    plane.init_info(1)
    plane.connect(timeout_s=5)
    with pytest.raises(WeightSyncError, match="deadline"):
        plane.send(delta_payload(), timeout_s=0.3)
    for t in threading.enumerate():
        if t.name.startswith("weightsync-nccl: NCCL broadcast"):
            t.join(SLACK_S)
    assert comm.destroyed == 1 and len(comm.sent) == 1 and comm.after_destroy == 0


def test_an_engine_receive_woken_by_the_abort_never_broadcasts_again(engine, calls, monkeypatch, store):
    """Worker side: vLLM's consumer holds the group it was given and loops over its buckets; after the
    sender's abort key destroyed the communicator, its next broadcast is refused."""
    comm = engine.test_comm
    comm.stall = True

    def consumer(info):
        group = engine._dense.model_update_group
        for _ in range(3):
            group.broadcast(torch.zeros(4), src=0)

    monkeypatch.setattr(engine._dense, "receive_weights", consumer)
    group_store(store, "grp/").set(key_abort(3), "rank 1 stalled")
    with pytest.raises(WeightSyncError, match=f"rank 2: {ABORTED_BY_SENDER}: rank 1 stalled"):
        engine.update_weights({"version": 7, "seq": 3, **nccl_update_info(dense_payload())})
    assert comm.destroyed == 1 and comm.after_destroy == 0


# ---------------------------------------------------------------------------- N11: cancel on a failed receiver
def beat(store, ranks: list[int], stop: threading.Event, dead: dict[int, float]) -> threading.Thread:
    """Heartbeats of ``ranks`` every 0.1 s; rank r stops beating ``dead[r]`` seconds in (its process died)."""
    t0 = time.monotonic()

    def run():
        while not stop.wait(0.1):
            for r in ranks:
                if time.monotonic() - t0 < dead.get(r, float("inf")):
                    store.add(key_heartbeat(r), 1)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("failure", ["nack", "dead"])
def test_a_push_is_cancelled_soon_after_a_receiver_fails(store, monkeypatch, failure):
    """A receiver that nacks (its load failed) or dies mid-push leaves the broadcast; the others would
    wait in it, paused, until its 30 s deadline here (212 s for a 7B model at the defaults). The sender
    reads the outcome counter and the heartbeats while it waits and aborts within seconds. (Heartbeat
    stall window 1 s here instead of 10.)"""
    monkeypatch.setattr(push_outcome, "ACK_STALL_S", 1.0)
    comm = FakeComm(stall=True)
    plane = fake_plane([comm], store=store)
    plane.init_info(1)
    plane.connect(timeout_s=5)
    stop = threading.Event()
    beat(store, [1, 2], stop, dead={2: 0.5} if failure == "dead" else {})
    if failure == "nack":
        threading.Timer(0.3, post_nack, (store, 4, 2, "ValueError('no parameter model.x')")).start()
        why = r"was cancelled: rank 2 .* failed to load it: ValueError\('no parameter model.x'\)"
    else:
        why = r"was cancelled: rank 2 .* has had no heartbeat for 1 s \(process dead or frozen\)"
    t0 = time.monotonic()
    try:
        with pytest.raises(WeightSyncError, match=rf"push #4\) {why} \(\d+ abandoned NCCL call\(s\) still blocked in "
                                                  r"this process\); NCCL communicator aborted"):
            plane.send(delta_payload(), timeout_s=30)
    finally:
        stop.set()
        plane.abort()  # the old code: still in the broadcast
    assert time.monotonic() - t0 < 10  # well before the 30 s deadline
    assert comm.destroyed == 1


def test_the_senders_plane_watches_the_group_store(store):
    ctx = PlaneContext(store, "127.0.0.1", store.port, "grp/", num_receivers=2, tp=1, bucket_bytes=64,
                       timeout_s=1.0, connect_timeout_s=1.0, mirror=True)
    assert NcclPlane.for_sender(ctx).store is store


# ---------------------------------------------------------------------------- C3: a delta received in chunks
def test_a_delta_is_received_in_chunks_of_bounded_memory(engine, calls):
    """vLLM's sparse receive allocates every patch of its update info before applying any, so the whole
    delta was on each engine's GPU at once. Received in calls of at most 512 MiB (536870912 bytes) of
    int32 indices + bf16 values (6 bytes per changed element): 40 M + 40 M changed = 480 MB fit, + 10 M
    (60 MB) would not; 10 M alone; 100 M (600 MB) is one patch larger than a chunk, alone; then 1 M."""
    counts = [40_000_000, 40_000_000, 10_000_000, 100_000_000, 1_000_000]
    names = [f"w{i}" for i in range(5)]
    engine.update_weights({"version": 8, "seq": 4, "kind": "delta", "names": names, "dtype_names": ["bfloat16"] * 5,
                           "shapes": [[n] for n in counts], "num_updates_list": counts})
    received = [(info.names, info.num_updates_list) for kind, info in calls if kind == "sparse"]
    assert received == [(["w0", "w1"], counts[:2]), (["w2"], counts[2:3]), (["w3"], counts[3:4]), (["w4"], counts[4:])]
    assert nccl_engine.PATCH_CHUNK_BYTES == 512 << 20
    assert max(6 * sum(c) for _, c in received if len(c) > 1) <= 512 << 20
