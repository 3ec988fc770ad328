"""Rank 0's push off the GPU and off the training stream (``weightsync.staging``), checked on CPU with
a fake of the CUDA calls: ``prepare`` stages what the payload and the delta baseline keep in host
memory on a side stream (C2), and a delta is broadcast on a dedicated stream ordered after that
staging by an event, never on the default stream and never with a device-wide synchronize (C1).
The ``gpu`` test does it for real."""

import contextlib

import pytest
import torch

from weightsync import sender as sender_mod
from weightsync.delta import DeltaEncoder
from weightsync.nccl import plane as nccl_plane
from weightsync.nccl.plane import NCCL_UNIQUE_ID_BYTES, NcclPlane, broadcast_patches
from weightsync.packing import Patch
from weightsync.plane import Payload
from weightsync.sender import WeightSender
from weightsync.staging import HostStager

BF16 = torch.bfloat16
TOKEN = "s7" * 32


class Named:
    def __init__(self, name):
        self.name = name


class FakeOps:
    """``staging.CudaOps`` with every call logged as (call, stream in use, args...)."""

    def __init__(self):
        self.log, self.current = [], "default"
        self._streams = {}

    def side_stream(self, device, role):
        return self._streams.setdefault(role, Named(role))

    def current_stream(self, device):
        return Named("default")

    def wait_stream(self, stream, other):
        self.log.append(("wait_stream", stream.name, other.name))

    def wait_event(self, stream, event):
        self.log.append(("wait_event", stream.name, event.name))

    @contextlib.contextmanager
    def use(self, stream):
        before, self.current = self.current, stream.name
        try:
            yield
        finally:
            self.current = before

    def copy_to_host(self, t, stream):
        self.log.append(("copy_to_host", self.current, stream.name))
        return torch.zeros(t.shape, dtype=t.dtype)

    def to_device(self, t, device):
        self.log.append(("to_device", self.current))
        return t.clone()

    def record_event(self, stream):
        self.log.append(("record_event", stream.name))
        return Named(f"event on {stream.name}")

    def synchronize(self, stream):
        self.log.append(("synchronize", stream.name))


@pytest.fixture
def no_device_sync(monkeypatch):
    """Any device-wide synchronisation, or use of the current (default) stream, fails the test."""
    def boom(*a, **kw):
        raise AssertionError("device-wide synchronize / default stream used")

    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    monkeypatch.setattr(torch.accelerator, "synchronize", boom)
    monkeypatch.setattr(torch.cuda, "current_stream", boom)


def test_prepare_leaves_nothing_on_the_device(monkeypatch, no_device_sync):
    """Tensors that report a device (meta here) come out of ``prepare`` as host copies, payload and
    delta baseline alike, each copied on the stage stream after the stream that produced it."""
    ops = FakeOps()
    monkeypatch.setattr(sender_mod, "HostStager", lambda: HostStager(ops))
    sender = WeightSender(1, token=TOKEN, mode="delta", full_every=4)
    try:
        named = [("a", torch.empty(3, 4, dtype=BF16, device="meta")), ("b", torch.empty(5, device="meta"))]
        payload = sender.prepare(iter(named), version=1)
    finally:
        sender.close()
    assert payload.mode == "full"
    assert [(n, t.device.type, tuple(t.shape), t.dtype) for n, t in payload.full] == [
        ("a", "cpu", (3, 4), BF16), ("b", "cpu", (5,), torch.float32)]
    assert all(t.device.type == "cpu" for t in sender._delta.baseline.values())
    assert ops.log == [("wait_stream", "stage", "default"), ("copy_to_host", "stage", "stage")] * 2 + [
        ("record_event", "stage")]
    assert payload.ready.name == "event on stage"


def test_the_delta_keeps_only_staged_tensors():
    """Patches (indices, values) and the next baseline are what ``stage`` returned."""
    staged = []

    def stage(t):
        staged.append(t.clone())
        return staged[-1]

    enc = DeltaEncoder("delta", full_every=10)
    enc.encode([("w", torch.zeros(1000, dtype=BF16))], version=0, seq=1, stage=stage)
    payload = enc.encode([("w", torch.zeros(1000, dtype=BF16).index_fill_(0, torch.tensor([3]), 1.0))],
                         version=1, seq=2, stage=stage)
    (patch,) = payload.patches
    ids = {id(t) for t in staged}
    assert {id(patch.indices), id(patch.values), id(enc.baseline["w"])} <= ids
    assert patch.indices.tolist() == [3]


def test_cpu_tensors_are_not_copied():
    stager = HostStager(FakeOps())
    t = torch.ones(3)
    assert stager(t) is t and stager.done() is None and stager.ops.log == []


class CudaComm:
    """A communicator that claims a CUDA device and logs (stream argument, stream in use) per broadcast."""

    def __init__(self, ops):
        self.device, self.ops, self.sent = torch.device("cuda", 0), ops, []

    def broadcast(self, tensor, src, stream=None):
        self.sent.append((tensor.tolist(), stream.name if stream is not None else None, self.ops.current))

    def destroy(self):
        pass


def patches():
    return [Patch("a", torch.tensor([0, 5], dtype=torch.int32), torch.tensor([1.0, 2.0], dtype=BF16), (2, 3)),
            Patch("b", torch.tensor([3], dtype=torch.int32), torch.tensor([4.0]), (4,))]


def test_delta_broadcast_runs_on_the_send_stream_after_the_prepare_event(no_device_sync):
    ops = FakeOps()
    comm = CudaComm(ops)
    broadcast_patches(comm, patches(), ready=Named("prepare"), ops=ops)
    assert ops.log[0] == ("wait_event", "send", "prepare")  # ordered after prepare's copies, on the device
    assert comm.sent == [([0, 5], "send", "send"), ([1.0, 2.0], "send", "send"), ([3], "send", "send"),
                         ([4.0], "send", "send")]
    assert ("to_device", "send") in ops.log and ops.log[-1] == ("synchronize", "send")  # only that stream
    assert all(c[0] != "synchronize" or c[1] == "send" for c in ops.log)


def test_the_plane_hands_the_prepare_event_to_the_delta_broadcast(monkeypatch, no_device_sync):
    ops = FakeOps()
    comm = CudaComm(ops)
    monkeypatch.setattr(nccl_plane, "on_device", lambda device: contextlib.nullcontext())
    plane = NcclPlane(1, communicator_factory=lambda uid, rank, world: comm,
                      mint_uid=lambda: bytes(NCCL_UNIQUE_ID_BYTES), ops=ops)
    plane.init_info(1)
    plane.connect(timeout_s=5)
    stats = plane.send(Payload(version=2, seq=2, patches=patches(), ready=Named("prepare")), timeout_s=30)
    assert stats["buckets"] == 4 and ops.log[0] == ("wait_event", "send", "prepare")
    assert {s for _, s, _ in comm.sent} == {"send"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_payload_is_pinned_host_memory():
    sender = WeightSender(1, token=TOKEN, mode="delta", full_every=4)
    try:
        w = torch.randn(256, 1024, device="cuda").to(BF16)
        first = sender.prepare([("w", w.clone())], version=1)
        first.wait_ready()
        (_, host), = first.full
        assert host.device.type == "cpu" and host.is_pinned() and torch.equal(host, w.cpu())
        w2 = w.clone()
        w2.view(-1)[:10] += 1
        second = sender.prepare([("w", w2)], version=2)
        second.wait_ready()
        (p,) = second.patches
        assert p.indices.is_pinned() and p.values.is_pinned() and p.indices.tolist() == list(range(10))
        assert sender._delta.baseline["w"].is_pinned()
    finally:
        sender.close()
