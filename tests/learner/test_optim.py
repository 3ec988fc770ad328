"""LR schedule goldens, clipping, and the non-finite-gradient rule."""

import math

import pytest
import torch

from learner.optim import lr_at, make_adamw, optimizer_step


def test_schedule_goldens():
    kw = dict(peak=1.0, warmup=4, total=14)
    # warm-up: (step+1)/4
    assert [lr_at(s, schedule="constant", **kw) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    # after warm-up, progress p = (step − 4)/10
    assert lr_at(9, schedule="linear", **kw) == pytest.approx(0.5)  # 1 − 0.5
    assert lr_at(14, schedule="linear", **kw) == pytest.approx(0.0)
    assert lr_at(9, schedule="cosine", **kw) == pytest.approx(0.5)  # ½(1 + cos π/2)
    assert lr_at(6, schedule="cosine", **kw) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))
    assert lr_at(40, schedule="cosine", **kw) == pytest.approx(0.0)  # clamped after the end
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_at(0, peak=1.0, warmup=0, total=1, schedule="step")


def _param(grad):
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor(grad)
    return p


def test_clip_scales_to_max_norm():
    p = _param([3.0, 4.0])  # norm 5
    opt = torch.optim.SGD([p], lr=1.0)
    norm, stepped = optimizer_step(opt, [p], max_norm=1.0, skip_nonfinite=False, what="t")
    assert stepped and norm == pytest.approx(5.0)
    torch.testing.assert_close(p.data, torch.tensor([-0.6, -0.8]), atol=1e-6, rtol=0)  # −g·(1/5)
    assert p.grad is None


def test_nonfinite_gradient_skips_or_raises():
    p = _param([float("nan"), 1.0])
    opt = make_adamw([p], 0.1, (0.9, 0.999), 0.0)
    norm, stepped = optimizer_step(opt, [p], max_norm=None, skip_nonfinite=True, what="t")
    assert not stepped and math.isnan(norm)
    assert p.data.tolist() == [0.0, 0.0] and p.grad is None
    p.grad = torch.tensor([float("inf"), 0.0])
    with pytest.raises(FloatingPointError, match="non-finite gradient"):
        optimizer_step(opt, [p], max_norm=1.0, skip_nonfinite=False, what="t")
    assert p.data.tolist() == [0.0, 0.0]
