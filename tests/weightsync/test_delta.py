"""Delta encoding (weightsync.delta): exact bitwise diffs, patches that rebuild the new tensors, bf16
rounding that makes small updates vanish, and the dense/delta schedule of a sender."""

import pytest
import torch

from weightsync import WeightSender
from weightsync.delta import DeltaEncoder, apply_patch, diff

BF16 = torch.bfloat16


def test_diff_and_apply_golden():
    old = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=BF16)
    new = torch.tensor([[1.0, 2.5], [3.0, -4.0]], dtype=BF16)
    idx, values = diff(old, new)
    assert idx.dtype == torch.int32 and idx.tolist() == [1, 3]  # flat positions of 2.0 -> 2.5, 4.0 -> -4.0
    assert values.dtype == BF16 and values.tolist() == [2.5, -4.0]
    target = old.clone()
    apply_patch(target, idx, values)
    assert torch.equal(target.view(torch.int16), new.view(torch.int16))
    with pytest.raises(ValueError, match="outside"):
        apply_patch(target, torch.tensor([4], dtype=torch.int32), values[:1])


def test_diff_compares_bits_not_values():
    nan = float("nan")
    old = torch.tensor([nan, 0.0, 1.0], dtype=BF16)
    new = torch.tensor([nan, -0.0, 1.0], dtype=BF16)
    idx, values = diff(old, new)
    assert idx.tolist() == [1]  # the same NaN is unchanged (NaN != NaN by value); 0.0 -> -0.0 is a change
    assert values.view(torch.int16).tolist() == [-32768]  # bits of bf16 -0.0: 0x8000


def test_bf16_rounding_hides_small_updates():
    """fp32 masters on the bf16 grid, one fp32 update each, compared in bf16. The bf16 spacing at w is
    2^(floor(log2|w|) - 7), so an update below half of it (2^(floor(log2|w|) - 8), between |w|/512 and
    |w|/256) rounds back to w and is not sent:
      1.0   + 2^-9    : half-spacing 2^-8 = 0.0039 > 0.00195    -> 1.0 (unchanged)
      1.0   + 0.005   : 1.005 is nearer 1 + 2^-7 = 1.0078125   -> 1.0078125 (sent)
      256.0 + 0.9     : half-spacing 2^0 = 1 > 0.9             -> 256.0 (unchanged)
      3.0   - 0.0075  : half-spacing 2^-7 = 0.0078 > 0.0075    -> 3.0 (unchanged)"""
    master = torch.tensor([1.0, 1.0, 256.0, 3.0])
    update = torch.tensor([2.0**-9, 0.005, 0.9, -0.0075])
    enc = DeltaEncoder("delta", full_every=100)
    assert enc.encode([("w", master.to(BF16))], version=0, seq=1).mode == "full"
    payload = enc.encode([("w", (master + update).to(BF16))], version=1, seq=2)
    assert payload.mode == "delta" and len(payload.patches) == 1
    patch = payload.patches[0]
    assert (patch.name, patch.shape, patch.indices.tolist(), patch.values.tolist()) == ("w", (4,), [1], [1.0078125])
    assert payload.changed_frac == 1 / 4
    unchanged = enc.encode([("w", (master + update).to(BF16))], version=2, seq=3)
    assert unchanged.patches == [] and unchanged.changed_frac == 0.0  # nothing changed: nothing sent


def test_dense_and_delta_schedule():
    g = torch.Generator().manual_seed(0)
    enc = DeltaEncoder("delta", full_every=3)
    w = torch.randn(16, 8, generator=g).to(BF16)
    mirror = None
    modes = []
    for seq in range(1, 8):
        w = w.clone()
        w.view(-1)[torch.randint(0, w.numel(), (5,), generator=g)] += 1.0
        payload = enc.encode([("w", w)], version=seq, seq=seq)
        modes.append(payload.mode)
        if payload.full is not None:
            mirror = payload.full[0][1].clone()
        else:
            for p in payload.patches:
                apply_patch(mirror, p.indices, p.values)
        assert torch.equal(mirror.view(torch.int16), w.view(torch.int16))  # the receiver's copy is exact
    assert modes == ["full", "delta", "delta", "full", "delta", "delta", "full"]  # pushes 1, 4, 7 dense
    assert enc.encode([("w", w[:8])], version=8, seq=8).mode == "full"  # a shape changed: dense
    full = DeltaEncoder("full")
    assert full.encode([("w", w)], version=0, seq=2).mode == "full" and full.baseline is None


def test_payloads_are_sent_in_order():
    sender = WeightSender(1, token="d1" * 32, mode="delta", full_every=4)
    first = sender.prepare([("w", torch.zeros(4))], version=0)
    second = sender.prepare([("w", torch.ones(4))], version=1)
    assert (first.mode, second.mode, second.changed_frac) == ("full", "delta", 1.0)
    with pytest.raises(ValueError, match="payload #2 sent after #0"):
        sender.send(second)
    sender.close()
    with pytest.raises(ValueError, match="weight_sync.mode"):
        WeightSender(1, token="d1" * 32, mode="sparse")
