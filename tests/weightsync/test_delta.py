"""Delta encoding (weightsync.delta): exact bitwise diffs, patches that rebuild the new tensors, bf16
rounding that makes small updates vanish, and the dense/delta schedule of a sender."""

import pytest
import torch

from weightsync import WeightSender
from weightsync.delta import DeltaEncoder, apply_patch, diff
from weightsync.gloo.plane import gloo_patch_cost

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
    first = sender.prepare([("w", torch.zeros(1000))], version=0)
    second = sender.prepare([("w", torch.zeros(1000).index_fill_(0, torch.tensor([7]), 1.0))], version=1)
    assert (first.mode, second.mode, second.changed_frac) == ("full", "delta", 0.001)
    with pytest.raises(ValueError, match="payload #2 sent after #0"):
        sender.send(second)
    sender.close()
    with pytest.raises(ValueError, match="weight_sync.mode"):
        WeightSender(1, token="d1" * 32, mode="sparse")


def changed(w: torch.Tensor, count: int) -> torch.Tensor:
    """``w`` with its first ``count`` elements changed (bf16 +1 at these magnitudes)."""
    out = w.clone()
    out.view(-1)[:count] += 1.0
    return out


@pytest.mark.parametrize("count, mode", [(270, "full"), (60, "delta"), (99, "delta"), (100, "full")])
def test_a_delta_larger_than_the_dense_push_is_sent_dense(count, mode):
    """vLLM's sparse NCCL format (the default cost): 4 + 2 bytes per changed bf16 element against 2 per
    element dense, so 300 elements break even at 100 changed (600 bytes): 90 % -> dense, 20 % -> delta."""
    enc = DeltaEncoder("delta", full_every=100)
    w = torch.zeros(300, dtype=BF16)
    enc.encode([("w", w)], version=0, seq=1)
    new = changed(w, count)
    payload = enc.encode([("w", new)], version=1, seq=2)
    assert payload.mode == mode
    if mode == "full":
        assert payload.full is not None and torch.equal(payload.full[0][1], new) and payload.changed_frac == 1.0
    after = enc.encode([("w", changed(new, 1))], version=2, seq=3)  # the baseline moved on either way
    assert after.mode == "delta" and after.patches[0].indices.tolist() == [0]


def test_the_gloo_format_breaks_even_near_half():
    """Gloo's patches cost 2 + 2 bytes per changed bf16 element (+ 4 per 65536-element block): 40 %
    changed is still a delta there, but dense on the int32-index cost (NCCL)."""
    w = torch.zeros(1 << 16, dtype=BF16)
    new = changed(w, int(0.4 * w.numel()))
    modes = []
    for cost in (gloo_patch_cost, None):
        enc = DeltaEncoder("delta", full_every=100, **({"patch_cost": cost} if cost else {}))
        enc.encode([("w", w)], version=0, seq=1)
        modes.append(enc.encode([("w", new)], version=1, seq=2).mode)
    assert modes == ["delta", "full"]
    assert gloo_patch_cost(32000, 1 << 16, 2) < 2 * (1 << 16) <= gloo_patch_cost(1 << 15, 1 << 16, 2)  # ~1/2
