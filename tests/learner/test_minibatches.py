"""Mini-batches × epochs: several optimiser steps per learner step make the trust region act.

With one optimiser step per batch the ratio π_θ/π_prox is exactly 1 at the only gradient, so PPO's clip
is inert and PACS' Â is 0. These tests run the real learner (one rank, tiny model) and check what
changes once a learner step takes several optimiser steps against one π_prox.
"""

import numpy as np
import pytest
import torch

import algos.policy_gradient
from learner.learner import Learner
from tests.learner.helpers import full_weights, make_cfg, make_groups


def _mean_change(a: dict, b: dict) -> float:
    """Mean |a − b| over every weight element."""
    total = sum(float(np.abs(a[k] - b[k]).sum()) for k in a)
    return total / sum(a[k].size for k in a)


def test_second_minibatch_sees_ratios_clips_and_no_gradient_through_clipped_tokens(tiny_dir, tokenizer,
                                                                                    monkeypatch):
    """4 groups, 2 mini-batches × 2 epochs = 4 optimiser steps. The first optimiser step runs at
    π_θ = π_prox (ratio 1, nothing clipped); later ones see ratios ≠ 1, a clipped share > 0, and the
    gradient of the loss w.r.t. log π_θ is exactly 0 on every clipped token (ε = 0.01 to make clipping
    certain at lr 1e-3)."""
    seen = []
    real = algos.policy_gradient.ppo_clip_loss

    def spy(logprobs, old, adv, mask, *a, **k):
        loss, metrics = real(logprobs, old, adv, mask, *a, **k)
        ratio = torch.exp(logprobs - old).detach()
        lo, hi = 1.0 - a[0], 1.0 + a[1]
        clipped = (((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < lo))) & (mask > 0)
        grad, = torch.autograd.grad((loss * mask).sum(), logprobs, retain_graph=True)
        seen.append((ratio[mask > 0], clipped, grad))
        return loss, metrics

    monkeypatch.setattr(algos.policy_gradient, "ppo_clip_loss", spy)
    cfg = make_cfg("grpo", learner={"batch_prompts": 4, "mini_batches": 2, "epochs": 2, "micro_batch_samples": 8},
                   loss={"clip_low": 0.01, "clip_high": 0.01, "is_correction": "none"})
    learner = Learner(cfg, 0, 1, tiny_dir)
    m = learner.step(make_groups(tokenizer, 4, 4, version=0), version=0)
    assert learner.optimizer_steps == 4 and m["optim/updates_per_step"] == 4
    assert len(seen) == 4  # one micro-batch (8 rows = 2 groups) per mini-batch
    first_ratio, first_clipped, _ = seen[0]
    assert torch.equal(first_ratio, torch.ones_like(first_ratio)) and not first_clipped.any()
    later_ratio = torch.cat([r for r, _, _ in seen[1:]])
    assert (later_ratio - 1).abs().max() > 0.01
    clipped = sum(int(c.sum()) for _, c, _ in seen[1:])
    assert clipped > 0 and m["pg/clipfrac"] > 0
    for _, c, grad in seen:
        assert torch.all(grad[c] == 0)  # the clipped branch is a constant in θ
        assert (grad[~c].abs() > 0).any()


def test_pacs_beta_matters_only_with_several_minibatches(tiny_dir, tokenizer):
    """PACS at one optimiser step per batch: Â = 0 and the update is β × a fixed direction, which Adam
    normalises away (β = 1 and β = 2 move the weights identically up to Adam's ε). With 2 mini-batches
    the second one has Â ≠ 0 and β changes the update."""
    groups = make_groups(tokenizer, 4, 4, version=0)
    moved = {}
    for mb in (1, 2):
        for beta in (1.0, 2.0):
            cfg = make_cfg("pacs", learner={"batch_prompts": 4, "mini_batches": mb}, pacs={"beta": beta})
            learner = Learner(cfg, 0, 1, tiny_dir)
            w0 = full_weights(learner)
            learner.step(groups, version=0)
            moved[mb, beta] = {k: v - w0[k] for k, v in full_weights(learner).items()}
    one = _mean_change(moved[1, 1.0], moved[1, 2.0])
    two = _mean_change(moved[2, 1.0], moved[2, 2.0])
    # Adam's first step is lr·g/(|g| + ε): scale-free except where |g| is near ε = 1e-8, so β only
    # shows up at the 1e-7 level there (lr 1e-3); with a second mini-batch it changes the update itself.
    assert one < 1e-6 and two > 1e-5 and two > 50 * one


def test_lr_schedule_counts_optimizer_steps(tiny_dir, tokenizer):
    """steps=10 learner steps × 2 mini-batches × 2 epochs = 40 optimiser steps of linear decay after a
    4-step warm-up: the four optimiser steps of learner step 1 use lr·(1/4, 2/4, 3/4, 4/4), their mean
    is lr·0.625 (= 1e-3·(0.25+0.5+0.75+1)/4)."""
    cfg = make_cfg("grpo", learner={"batch_prompts": 4, "mini_batches": 2, "epochs": 2, "warmup_steps": 4,
                                    "lr_schedule": "linear"})
    learner = Learner(cfg, 0, 1, tiny_dir)
    assert learner.total_optimizer_steps == 40
    m = learner.step(make_groups(tokenizer, 4, 4), version=0)
    assert m["optim/lr"] == pytest.approx(1e-3 * 0.625) and m["optim/steps"] == 4


def test_prox_forward_is_skipped_at_one_optimizer_step_with_the_same_update(tiny_dir, tokenizer, monkeypatch):
    """At mini_batches = epochs = 1 π_prox equals the detached log-probs of the training forward: the
    separate no-grad pass is skipped (half the policy forwards) and the update is the same as with it."""
    import learner.learner as learner_module

    groups = make_groups(tokenizer, 2, 4, version=1)
    calls = []
    real = learner_module.run_scorer
    monkeypatch.setattr(learner_module, "run_scorer", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = {}
    for forced in (False, True):
        learner = Learner(make_cfg("grpo", loss={"entropy_coef": 0.01}), 0, 1, tiny_dir)
        learner.prox_before_update = forced
        calls.clear()
        m = learner.step(groups, version=1)
        out[forced] = (m, full_weights(learner), len(calls))
    (m_lazy, w_lazy, n_lazy), (m_full, w_full, n_full) = out[False], out[True]
    assert (n_lazy, n_full) == (0, 1) and "time/logprob_s" not in m_lazy
    for k in ("loss/total", "optim/grad_norm", "is/weight_mean", "mismatch/kl", "pg/ppo_kl"):
        assert m_lazy[k] == pytest.approx(m_full[k], rel=1e-6, abs=1e-9), k
    for k in w_lazy:
        np.testing.assert_allclose(w_lazy[k], w_full[k], atol=1e-7, rtol=0, err_msg=k)


def test_more_minibatches_than_groups_is_a_clear_error(tiny_dir, tokenizer):
    learner = Learner(make_cfg("grpo", learner={"batch_prompts": 4, "mini_batches": 4}), 0, 1, tiny_dir)
    with pytest.raises(ValueError, match="learner.mini_batches=4 needs at least 4 groups per step, got 2"):
        learner.step(make_groups(tokenizer, 2, 4), version=0)
