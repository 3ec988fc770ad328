"""Real FSDP2 across 2 gloo processes equals 1 rank on the same global batch; cross-size resume."""

import numpy as np
import pytest

from learner.learner import Learner
from tests.learner.helpers import fail_on_rank_1, full_weights, make_cfg, make_groups, rank_info
from tests.learner.local_ranks import LearnerGroup, spawn_ranks

pytestmark = pytest.mark.slow


def test_two_ranks_equal_one_rank_and_checkpoint_moves_between_sizes(tiny_dir, tokenizer, tmp_path):
    """PRIME (policy, frozen reference, trainable PRM — every model sharded over both ranks),
    aggregation seq-mean-token-mean, 16 rows in 2 mini-batches of 2 groups (two optimiser steps per
    learner step, each normalised by its own mini-batch's global counts): 1 rank × 2 micro-batches per
    mini-batch (plain module) vs 2 ranks × 1 (FSDP2). Step 2's advantages depend on the PRM update of
    step 1, so both models must agree. The 2-rank checkpoint loads back into the sharded ranks and into
    the single rank."""
    cfg = make_cfg("prime", learner={"micro_batch_samples": 4, "batch_prompts": 4, "mini_batches": 2},
                   loss={"agg": "seq-mean-token-mean"}, prime={"prm_lr": 1e-3})
    data = [make_groups(tokenizer, 4, 4, version=s, seed=s) for s in range(2)]
    with LearnerGroup(cfg, 2, str(tiny_dir), timeout_s=300) as group:
        two = [group.step(data[s], version=s) for s in range(2)]
        w_two = group.call(full_weights)
        ckpt = group.save(tmp_path / "step_2", {"cursor": 8})
        idle = group.step(data[0][:2], version=2)  # one group per mini-batch: rank 1 runs dummies only
        assert idle["batch/rows"] == 8 and all(np.isfinite(v) for v in idle.values())
        assert group.load(ckpt) == {"cursor": 8}  # then load the sharded state back
        w_loaded = group.call(full_weights)
        after_two = group.step(data[0], version=2)  # continues from the loaded weights, moments, PRM
        w_after_two = group.call(full_weights)[0]
        with pytest.raises(RuntimeError, match="(?s)rank 1 failed.*deliberate failure"):
            group.call(fail_on_rank_1)

    one_learner = Learner(cfg, 0, 1, tiny_dir)
    w0 = full_weights(one_learner)
    one = [one_learner.step(data[s], version=s) for s in range(2)]
    w_one = full_weights(one_learner)

    assert [m["batch/microbatches_per_rank"] for m in one + two] == [2, 2, 1, 1]
    assert [m["optim/steps"] for m in one + two] == [2, 4, 2, 4]
    assert two[1]["pg/clipfrac"] >= 0 and two[1]["pg/ppo_kl"] != 0  # the second mini-batch saw π_θ ≠ π_prox
    for m1, m2 in zip(one, two):
        for k in ("loss/total", "loss/pg", "optim/grad_norm", "prime/prm_loss", "prime/prm_grad_norm", "prime/q_mean",
                  "prime/dpo_acc", "batch/response_tokens", "entropy"):
            assert m1[k] == pytest.approx(m2[k], rel=1e-5, abs=1e-7), k
    assert abs(two[1]["prime/q_mean"]) > 0  # step 2 scores with the PRM trained at step 1
    for k in w_one:
        np.testing.assert_array_equal(w_two[0][k], w_two[1][k], err_msg=k)  # both ranks see one model
        np.testing.assert_array_equal(w_loaded[1][k], w_two[0][k], err_msg=k)
        # two Adam steps of lr 1e-3 (see test_learner_algos for why not machine precision)
        np.testing.assert_allclose(w_two[0][k], w_one[k], atol=3e-5, rtol=0, err_msg=k)
        assert np.abs(w_one[k] - w0[k]).max() > 1e-3, k

    resumed = Learner(cfg, 0, 1, tiny_dir)  # saved by 2 ranks, loaded by 1
    assert resumed.load(ckpt) == {"cursor": 8}
    assert resumed.providers["prime_q"].version == 2 and resumed.optimizer_steps == 4
    for k, v in full_weights(resumed).items():
        np.testing.assert_array_equal(v, w_two[0][k], err_msg=k)
    after_one = resumed.step(data[0], version=2)
    for k in ("loss/total", "optim/grad_norm", "prime/prm_loss", "prime/prm_version"):
        assert after_one[k] == pytest.approx(after_two[k], rel=1e-5), k
    for k, v in full_weights(resumed).items():  # wrong Adam moments would move weights by ~lr
        np.testing.assert_allclose(v, w_after_two[k], atol=3e-5, rtol=0, err_msg=k)


def test_spawn_ranks_returns_in_rank_order_and_reports_failures():
    out = spawn_ranks(rank_info, 2, "ok", timeout_s=120)
    assert [o[:3] for o in out] == [(0, 2, "ok"), (1, 2, "ok")] and out[0][3] == out[1][3]
    with pytest.raises(RuntimeError, match="(?s)learner rank 1 failed.*rank 1 refuses"):
        spawn_ranks(rank_info, 2, "fail", timeout_s=120)


def test_the_learners_process_group_takes_the_configured_collective_timeout(tiny_dir, monkeypatch):
    """learner.collective_timeout_s reaches the process group (gpu_path.md C11: torch's NCCL default of 600 s
    bounded a slow checkpoint's closing collectives); the default is 1800 s."""
    import learner.learner as module
    from learner.learner import Learner
    from tests.learner.helpers import make_cfg

    seen = []

    def capture(rank, world_size, device, init_method=None, timeout_s=600.0):
        seen.append(timeout_s)
        raise RuntimeError("captured")

    monkeypatch.setattr(module, "init_distributed", capture)
    cfg = make_cfg("grpo")
    assert cfg.learner.collective_timeout_s == 1800.0
    cfg.learner.collective_timeout_s = 1234.0
    with pytest.raises(RuntimeError, match="captured"):
        Learner(cfg, 0, 1, tiny_dir)
    assert seen == [1234.0]
