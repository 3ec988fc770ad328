"""PRIME's detached-DPO PRM losses in the learner: the extra no-grad forward, the group broadcast and
the global normalisation (the PRM update does not depend on the micro-batch split)."""

import math

import numpy as np
import pytest

from learner.learner import Learner
from tests.learner.helpers import make_cfg, make_groups


def _prm_weights(learner) -> dict:
    return {k: v.detach().double().cpu().numpy() for k, v in learner.providers["prime_q"].model.named_parameters()}


@pytest.mark.parametrize("prm_loss", ["dpo", "bon_acc", "bon_rm"])
def test_detached_prm_losses_are_microbatch_invariant(prm_loss, tiny_dir, tokenizer):
    """4 groups of 4 rows in 1 micro-batch of 16 or 8 of 2 (groups split across micro-batches): the
    same PRM loss Σ_i w_i ℓ_i / 16 and the same PRM update; the PRM moves and the loss is finite.
    Step 2 scores with the PRM trained at step 1, so Q_bc ≠ 0 there."""
    groups = make_groups(tokenizer, 4, 4, version=1)
    metrics, weights, before = [], [], None
    for mb in (16, 2):
        cfg = make_cfg("prime", learner={"micro_batch_samples": mb, "batch_prompts": 4},
                       prime={"prm_loss": prm_loss, "prm_lr": 1e-3})
        learner = Learner(cfg, 0, 1, tiny_dir)
        before = _prm_weights(learner)
        learner.step(groups, version=1)
        metrics.append(learner.step(groups, version=2))
        weights.append(_prm_weights(learner))
    assert metrics[0]["batch/microbatches_per_rank"] == 1 and metrics[1]["batch/microbatches_per_rank"] == 8
    for k in ("prime/prm_loss", "prime/prm_grad_norm", "prime/q_mean", "loss/total"):
        assert math.isfinite(metrics[0][k])
        assert metrics[0][k] == pytest.approx(metrics[1][k], rel=1e-5, abs=1e-7), k
    assert metrics[0]["prime/prm_version"] == 2.0 and abs(metrics[0]["prime/q_mean"]) > 0
    moved = max(float(np.abs(weights[0][k] - before[k]).max()) for k in before)
    assert moved > 1e-4
    # Two Adam steps of lr 1e-3 move weights by ~2e-3; elements whose gradient is near Adam's eps amplify
    # fp32 summation-order noise (see test_learner_algos), so the bound is 5% of one step. A wrong
    # normaliser (e.g. per micro-batch) would change prm_loss above by ×8.
    for k in weights[0]:
        np.testing.assert_allclose(weights[0][k], weights[1][k], atol=5e-5, rtol=0, err_msg=k)
