"""Learner rank 0 allocates the weight sync's staging memory from the policy's shapes when its group
forms (`LearnerRank.connect_sender`), keeps it when the group is rebuilt (an actor restart), and its
first push then only copies into it. The fake CUDA ops stage the CPU learner's tensors as a GPU
learner's would be."""

import pytest

from launch.processes.roles import LearnerRank
from tests.learner.helpers import make_cfg
from tests.weightsync.fake_cuda import FakeOps
from weightsync import sender as sender_mod
from weightsync.sender import WeightSender
from weightsync.staging import StagingArea, pinned_staging_bytes

TOKEN = "c3" * 32


@pytest.mark.parametrize("mode", ["full", "delta"])
def test_rank_0_stages_its_first_push_in_memory_allocated_when_the_group_formed(tiny_dir, monkeypatch, mode):
    ops = FakeOps(stage_cpu=True)
    monkeypatch.setattr(sender_mod, "StagingArea", lambda: StagingArea(ops))
    monkeypatch.setattr(WeightSender, "connect", lambda self: None)  # no actors here
    rank = LearnerRank(make_cfg(weight_sync={"mode": mode, "backend": "gloo"}), 0, 1, str(tiny_dir))
    try:
        learner = rank.learner
        sizes = [t.numel() * t.element_size() for _, t in learner.named_full_weights(learner.compute_dtype)]
        rank.reset_sender(1, TOKEN)
        rank.connect_sender()
        # one buffer per tensor of the push in the serving dtype; in delta mode the patch arena after them
        assert ops.allocations()[:len(sizes)] == sizes
        assert rank.sender._staging.memory.allocated == pinned_staging_bytes(sum(sizes), mode, tensors=len(sizes))
        rank.reset_sender(1, TOKEN)  # the group rebuilt: the same memory
        rank.connect_sender()
        allocated = ops.allocations()
        first = rank.sender.prepare(learner.named_full_weights(learner.compute_dtype), version=1)
        assert ops.allocations() == allocated and len(allocated) == len(sizes) + (mode == "delta")
        slots = rank.sender._staging.memory.slots
        assert all(t.data_ptr() == slots[n].data_ptr() for n, t in first.full)  # copied into them
    finally:
        rank.close()
