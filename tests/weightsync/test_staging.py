"""Rank 0's push off the GPU and off the training stream (``weightsync.staging``), checked on CPU with
a fake of the CUDA calls: ``prepare`` stages what the payload and the delta baseline keep in host
memory on a side stream (C2), and a delta is broadcast on a dedicated stream ordered after that
staging by an event, never on the default stream and never with a device-wide synchronize (C1),
dropping each device copy after its broadcast (N3). The host memory is allocated once, at the exact
size, and reused once a push was sent (N2 of reviews/gpu_path_2.md). The ``gpu`` tests do it for real."""

import contextlib
import gc
import weakref

import pytest
import torch

from tests.weightsync.fake_cuda import FakeOps, Named
from weightsync import sender as sender_mod
from weightsync.delta import DeltaEncoder, apply_patch
from weightsync.gloo.plane import gloo_patch_cost
from weightsync.nccl import plane as nccl_plane
from weightsync.nccl.plane import NCCL_UNIQUE_ID_BYTES, NcclPlane, broadcast_patches
from weightsync.packing import Patch
from weightsync.plane import Payload
from weightsync.sender import WeightSender
from weightsync.staging import ALIGN, HOST_BUFFER_OVERHEAD, PAGE, CudaOps, StagingArea, pinned_staging_bytes

BF16 = torch.bfloat16
TOKEN = "s7" * 32


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
    monkeypatch.setattr(sender_mod, "StagingArea", lambda: StagingArea(ops))
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
    # a: 12 bf16 = 24 bytes, b: 5 fp32 = 20 bytes, each in a host buffer of its own size
    assert ops.log == [("host_buffer", 24), ("wait_stream", "stage", "default"), ("copy_to_host", "stage", "stage"),
                       ("host_buffer", 20), ("wait_stream", "stage", "default"), ("copy_to_host", "stage", "stage"),
                       ("record_event", "stage")]
    assert payload.ready.name == "event on stage"


def test_the_delta_keeps_only_staged_tensors():
    """Patches (indices, values) and the next baseline are what the stager returned."""
    staged = []

    class Recorder:
        def expect_delta(self, dense_bytes, tensors):
            pass

        def weight(self, name, t):
            staged.append(t.clone())
            return staged[-1]

        def patch(self, t):
            return self.weight("", t)

    enc = DeltaEncoder("delta", full_every=10)
    enc.encode([("w", torch.zeros(1000, dtype=BF16))], version=0, seq=1, stager=Recorder())
    payload = enc.encode([("w", torch.zeros(1000, dtype=BF16).index_fill_(0, torch.tensor([3]), 1.0))],
                         version=1, seq=2, stager=Recorder())
    (patch,) = payload.patches
    ids = {id(t) for t in staged}
    assert {id(patch.indices), id(patch.values), id(enc.baseline["w"])} <= ids
    assert patch.indices.tolist() == [3]


def test_cpu_tensors_are_not_copied():
    stager = StagingArea(CudaOps()).stager(1)
    t = torch.ones(3)
    assert stager.weight("t", t) is t and stager.patch(t) is t and stager.done() is None
    assert stager.memory.allocated == 0


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
    monkeypatch.setattr(nccl_plane, "build_ring", lambda comm: comm)  # its warm-up would allocate on "cuda"
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_staging_is_registered_exactly_and_reused():
    """Real ``cudaHostRegister``: staged bytes are pinned and right, torch's pinned cache does not grow
    (it would round 135.8 MB up to 256 MiB), and a push after a sent one reuses the same host buffer."""
    area, enc = StagingArea(), DeltaEncoder("full")
    before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    w = torch.randn(18944, 3584, device="cuda").to(BF16)  # a Qwen2.5-7B MLP matrix: 135.8 MB
    ptrs = []
    for seq in (1, 2):
        stager = area.stager(seq)
        payload = enc.encode([("w", w + seq)], version=seq, seq=seq, stager=stager)
        payload.ready = stager.done()
        payload.wait_ready()
        (_, host), = payload.full
        assert host.is_pinned() and torch.equal(host, (w + seq).cpu())
        ptrs.append(host.data_ptr())
        area.release(seq)
    assert ptrs[0] == ptrs[1] and area.memory.allocated == 18944 * 3584 * 2 + HOST_BUFFER_OVERHEAD
    assert torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) == before


# ---------------------------------------------------------------------------- N3: one device copy at a time
class CountingComm(CudaComm):
    """Also counts, at each broadcast, how many earlier device copies are still alive."""

    def __init__(self, ops):
        super().__init__(ops)
        self.copies, self.alive = [], []

    def broadcast(self, tensor, src, stream=None):
        self.alive.append(sum(ref() is not None for ref in self.copies))
        self.copies.append(weakref.ref(tensor))
        super().broadcast(tensor, src, stream)


def test_each_device_copy_of_a_delta_is_dropped_after_its_broadcast(no_device_sync):
    """The copies are made on the send stream, which also runs the broadcasts, so the caching allocator
    may reuse a copy's memory as soon as it is dropped: keeping them all held the whole delta on rank
    0's GPU (3 earlier copies alive at the 4th broadcast here)."""
    ops = FakeOps()
    comm = CountingComm(ops)
    broadcast_patches(comm, patches(), ready=Named("prepare"), ops=ops)
    assert len(comm.alive) == 4 and max(comm.alive) == 0


# ---------------------------------------------------------------------------- N2: staging memory
def weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """Three bf16 tensors (4096 + 200 + 42 = 4338 bytes); from step 1 on, ``step`` elements of the
    first changed by 1.0 more each step (a bf16-visible change at these magnitudes)."""
    out = [("a", torch.zeros(64, 32, dtype=BF16)), ("b", torch.ones(100, dtype=BF16)),
           ("c", torch.full((7, 3), 2.0, dtype=BF16))]
    out[0][1].view(-1)[:step] += float(step)
    return out


def test_staging_memory_is_allocated_once_exactly_and_reused():
    """Delta mode, dense every 3 pushes: the first push allocates one buffer per tensor of its exact
    size, the first delta one patch arena of the dense push's size, and nothing after; dense pushes
    and the baseline overwrite the same buffers, and the receiver's copy stays exact."""
    ops = FakeOps(stage_cpu=True)
    area, enc = StagingArea(ops), DeltaEncoder("delta", full_every=3)
    mirror, modes, first_ptr = {}, [], None
    for seq in range(1, 7):
        new = weights(seq)
        stager = area.stager(seq)
        payload = enc.encode(iter(new), version=seq, seq=seq, stager=stager)
        payload.ready = stager.done()
        modes.append(payload.mode)
        if payload.full is not None:
            mirror = {n: t.clone() for n, t in payload.full}
            first_ptr = first_ptr or payload.full[0][1].data_ptr()
            assert payload.full[0][1].data_ptr() == first_ptr  # the same host buffer every dense push
        else:
            for p in payload.patches:
                apply_patch(mirror[p.name], p.indices, p.values)
        assert all(torch.equal(mirror[n].view(torch.int16), t.view(torch.int16)) for n, t in new)
        area.release(seq)  # sent
    assert modes == ["full", "delta", "delta", "full", "delta", "delta"]
    # slots of 64*32*2, 100*2, 21*2 bytes, then an arena of their 4338 bytes + 2 views x 64 x 3 tensors
    assert ops.allocations() == [4096, 200, 42, 4338 + 2 * ALIGN * 3]
    assert area.memory.allocated == pinned_staging_bytes(4338, "delta", tensors=3) == \
        2 * 4338 + 2 * ALIGN * 3 + 4 * HOST_BUFFER_OVERHEAD


def test_a_payload_not_yet_sent_keeps_its_memory():
    """The next push is staged in new buffers while the previous payload was not sent (or its send
    failed): overwriting them would change what is still to be sent, or being read."""
    ops = FakeOps(stage_cpu=True)
    area, enc = StagingArea(ops), DeltaEncoder("full")
    first = enc.encode(iter(weights(1)), version=1, seq=1, stager=area.stager(1))
    enc.encode(iter(weights(2)), version=2, seq=2, stager=area.stager(2))  # payload 1 unsent
    assert first.full[0][1].view(-1)[:3].tolist() == [1.0, 0.0, 0.0]  # still push 1's bytes
    assert len(ops.allocations()) == 6  # two sets of three buffers
    area.release(2)
    enc.encode(iter(weights(3)), version=3, seq=3, stager=area.stager(3))
    assert len(ops.allocations()) == 6  # push 2 was sent: its buffers took push 3


def test_a_delta_staged_in_new_memory_has_room_for_its_patches():
    """Push 1 unsent, so push 2 (a delta) is staged in new buffers: its patch arena is still sized for
    the whole dense push (4 + 2048 bf16 = 4104 bytes), not for the tensors staged before its first
    patch. Patches: 4 + 100 changed elements x 6 bytes = 624 < 4104, a delta."""
    def named(step):
        return [("s", torch.full((4,), float(step), dtype=BF16)),
                ("big", torch.zeros(2048, dtype=BF16).index_fill_(0, torch.arange(100 * step), 1.0))]

    ops = FakeOps(stage_cpu=True)
    area, enc = StagingArea(ops), DeltaEncoder("delta", full_every=10)
    enc.encode(iter(named(0)), version=0, seq=1, stager=area.stager(1))
    payload = enc.encode(iter(named(1)), version=1, seq=2, stager=area.stager(2))
    assert payload.mode == "delta" and [p.indices.numel() for p in payload.patches] == [4, 100]
    # push 1's slots; push 2: the arena (at its first patch, before the slot of that tensor), new slots
    assert ops.allocations() == [8, 4096, 4104 + 2 * ALIGN * 2, 8, 4096]


def test_staged_patches_never_outgrow_the_dense_push():
    """The patch arena is as large as the dense push: 65536 bf16 = 131072 bytes (+ 2 x 64). With 40 %
    (26214) changed, gloo's format would send a delta of 8 (the block's count, padded) + 52432 (uint16
    offsets, padded to 8) + 52428 (values) = 104868 bytes, but the staged int32 indices and values
    take 26214 x 4 + 26214 x 2 = 157284 bytes: on a GPU learner that push goes dense (on a CPU learner
    nothing is staged: test_delta's gloo break-even)."""
    w = torch.zeros(1 << 16, dtype=BF16)
    new = w.clone()
    new[:26214] += 1.0
    enc = DeltaEncoder("delta", full_every=100, patch_cost=gloo_patch_cost)
    area = StagingArea(FakeOps(stage_cpu=True))
    enc.encode([("w", w)], version=0, seq=1, stager=area.stager(1))
    area.release(1)
    payload = enc.encode([("w", new)], version=1, seq=2, stager=area.stager(2))
    assert payload.mode == "full" and torch.equal(payload.full[0][1], new)
    assert gloo_patch_cost(26214, 1 << 16, 2) == 104868 < 131072


def test_pinned_staging_bytes_of_a_7b_model():
    """Qwen2.5-7B in bf16: 7.615e9 parameters x 2 bytes = 15.23 GB in 339 tensors (28 layers x 12, the
    embedding, the final norm, the LM head). torch's pinned allocator took 28.96 GB for it (powers of
    two) and about twice that in delta mode; staged exactly: 15.23 GB + 339 x 8 KiB, and in delta mode
    the patch arena as much again."""
    payload = 7_615_616_512 * 2
    assert pinned_staging_bytes(payload, "full", tensors=339) == payload + 339 * 8192
    delta = pinned_staging_bytes(payload, "delta", tensors=339)
    assert delta == 2 * payload + 339 * 8192 + 339 * 128 + 8192
    assert round(delta / 1e9, 2) == 30.47
    with pytest.raises(ValueError, match="weight_sync.mode"):
        pinned_staging_bytes(payload, "sparse")


def test_host_buffers_lock_exact_pages_of_their_own(monkeypatch):
    """``CudaOps.host_buffer`` with ``cudaHostRegister`` faked: each buffer is a view of exactly the bytes
    asked for, on registered whole pages inside its own allocation (so no two buffers share a page:
    registering a page twice fails), unregistered when the last view of it is freed."""
    calls = []

    class Cudart:
        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr, size))
            return 0

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    sizes = (10, 4096, 10000)
    bufs = [CudaOps().host_buffer(n) for n in sizes]
    registered = [c[1:] for c in calls]
    for buf, (ptr, size), n in zip(bufs, registered, sizes, strict=True):
        assert (buf.numel(), buf.dtype, buf.data_ptr()) == (n, torch.uint8, ptr)
        assert ptr % PAGE == 0 and size == -(-n // PAGE) * PAGE  # 4096, 4096, 12288: whole pages
        storage = buf.untyped_storage()
        assert storage.data_ptr() <= ptr and ptr + size <= storage.data_ptr() + storage.nbytes()
    del bufs, buf, storage
    gc.collect()
    assert sorted(c[1] for c in calls if c[0] == "unregister") == sorted(ptr for ptr, _ in registered)
