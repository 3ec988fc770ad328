"""Staging memory allocated ahead of the first push (``WeightSender.reserve_staging``): registering the
host pages of a 7B push (15.2 GB, 30.5 GB in delta mode) takes seconds that the first push spent
between two training steps; now the sender allocates them from the model's shapes before it, the
first push only copies, and a replacing sender keeps them (``staging_handover``). Checked with the fake
CUDA ops (CPU tensors staged as a GPU learner's would be)."""

import torch

from tests.weightsync.fake_cuda import FakeOps
from weightsync import sender as sender_mod
from weightsync.sender import WeightSender
from weightsync.staging import ALIGN, CudaOps, StagingArea, pinned_staging_bytes

BF16 = torch.bfloat16
TOKEN = "a9" * 32


def fp32_weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """fp32 tensors of 64 x 32, 100 and 7 x 3 elements: 4096, 200 and 42 bytes once cast to bf16 (4338),
    plus an empty one (never staged); ``step`` elements of the first one change by ``step``."""
    a = torch.zeros(64, 32)
    a.view(-1)[:step] += float(step)
    return [("a", a), ("b", torch.ones(100)), ("c", torch.zeros(7, 3)), ("e", torch.zeros(0))]


def shapes(named) -> list[tuple[str, torch.Size, torch.dtype]]:
    return [(n, t.shape, t.dtype) for n, t in named]


def test_the_first_push_finds_its_staging_memory_allocated(monkeypatch):
    """Delta mode, fp32 weights sent as bf16: ``reserve_staging`` allocates a buffer per tensor in the
    wire dtype and the patch arena, ``pinned_staging_bytes`` of them; the dense first push and the
    delta after it allocate nothing more, and the first push's host tensors are those buffers."""
    ops = FakeOps(stage_cpu=True)
    monkeypatch.setattr(sender_mod, "StagingArea", lambda: StagingArea(ops))
    sender = WeightSender(1, token=TOKEN, mode="delta", full_every=10, cast_dtype=BF16)
    try:
        held = sender.reserve_staging(shapes(fp32_weights(0)), torch.device("cpu"))
        # bf16 slots of 64*32*2, 100*2, 21*2 bytes; the arena: their 4338 bytes + 2 views x 64 x 4 tensors
        assert ops.allocations() == [4096, 200, 42, 4338 + 2 * ALIGN * 4]
        assert held == pinned_staging_bytes(4338, "delta", tensors=3) + 2 * ALIGN  # + the empty one's views
        slots = {n: buf.data_ptr() for n, buf in sender._staging.memory.slots.items()}
        first = sender.prepare(iter(fp32_weights(1)), version=1)
        assert {n: t.data_ptr() for n, t in first.full if t.numel()} == slots
        assert [c[0] for c in ops.log].count("host_buffer") == 4  # the first push only copied
        sender._staging.release(1)  # sent
        second = sender.prepare(iter(fp32_weights(2)), version=2)
        assert second.mode == "delta" and len(ops.allocations()) == 4
    finally:
        sender.close()


def test_a_replacing_sender_keeps_the_memory_unless_a_push_in_it_was_not_sent(monkeypatch):
    ops = FakeOps(stage_cpu=True)
    old = WeightSender(1, token=TOKEN, staging=StagingArea(ops))
    old.reserve_staging(shapes(fp32_weights(0)), torch.device("cpu"))
    new = WeightSender(1, token=TOKEN, staging=old.staging_handover())
    new.reserve_staging(shapes(fp32_weights(0)), torch.device("cpu"))
    assert ops.allocations() == [256 * 32, 400, 84]  # fp32, once: the new sender found them
    new.prepare(iter(fp32_weights(1)), version=1)  # not sent: the next sender must not overwrite it
    newer = WeightSender(1, token=TOKEN, staging=new.staging_handover())
    newer.reserve_staging(shapes(fp32_weights(0)), torch.device("cpu"))
    assert ops.allocations() == [8192, 400, 84] * 2
    for s in (old, new, newer):
        s.close()


def test_a_cpu_learner_reserves_nothing():
    """CPU tensors are never staged (``CudaOps.on_host``), so nothing is allocated for them."""
    sender = WeightSender(1, token=TOKEN, mode="delta", staging=StagingArea(CudaOps()))
    try:
        assert sender.reserve_staging(shapes(fp32_weights(0)), torch.device("cpu")) == 0
        assert sender._staging.memory.allocated == 0
    finally:
        sender.close()
