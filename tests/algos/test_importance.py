"""Behaviour-policy importance correction: weights, drops and metrics on hand-computed tokens."""

import math

import pytest
import torch

from algos.importance import importance_correction

# log π_prox − log μ = [ln 0.25, 0, ln 3, ln 10] on four on-policy tokens -> raw w = [0.25, 1, 3, 10]
PROX = torch.tensor([[math.log(0.25), 0.0, math.log(3.0), math.log(10.0)]])
BEHAV = torch.zeros(1, 4)
MASK = torch.ones(1, 4)


def test_tis_truncates_at_cap():
    c = importance_correction(PROX, BEHAV, MASK, "tis", cap=2.0)
    torch.testing.assert_close(c.weight, torch.tensor([[0.25, 1.0, 2.0, 2.0]]))
    assert c.keep.tolist() == [[1.0, 1.0, 1.0, 1.0]]
    assert float(c.metrics["is/clip_frac"]) == pytest.approx(0.5)  # 3 and 10 exceed C = 2
    assert float(c.metrics["is/weight_mean"]) == pytest.approx((0.25 + 1 + 3 + 10) / 4)
    assert float(c.metrics["is/weight_max"]) == pytest.approx(10.0)
    # ESS = (Σw)² / (N Σw²) = 14.25² / (4 × (0.0625 + 1 + 9 + 100)) = 203.0625 / 440.25
    assert float(c.metrics["is/ess"]) == pytest.approx(203.0625 / 440.25)
    # k3 mismatch KL: mean of w − ln w − 1 over tokens
    k3 = sum(w - math.log(w) - 1 for w in (0.25, 1.0, 3.0, 10.0)) / 4
    assert float(c.metrics["mismatch/kl"]) == pytest.approx(k3, rel=1e-5)


def test_mask_drops_outside_window():
    c = importance_correction(PROX, BEHAV, MASK, "mask", cap_min=0.5, cap_max=5.0)
    assert c.keep.tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert c.weight.tolist() == [[1.0, 1.0, 1.0, 1.0]]


def test_decoupled_weights_by_raw_ratio_and_drops_above_cap():
    c = importance_correction(PROX, BEHAV, MASK, "decoupled", cap=5.0)
    torch.testing.assert_close(c.weight, torch.tensor([[0.25, 1.0, 3.0, 0.0]]))
    assert c.keep.tolist() == [[1.0, 1.0, 1.0, 0.0]]


def test_none_and_masked_tokens_ignored_in_metrics():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])  # the large weights sit on masked-out tokens
    c = importance_correction(PROX, BEHAV, mask, "none")
    assert c.weight.tolist() == [[1.0, 1.0, 1.0, 1.0]]
    assert float(c.metrics["is/weight_max"]) == pytest.approx(1.0)
    assert float(c.metrics["is/clip_frac"]) == 0.0
    with pytest.raises(ValueError, match="unknown is_correction"):
        importance_correction(PROX, BEHAV, MASK, "vtrace")
