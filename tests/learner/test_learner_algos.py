"""One real optimiser step for every algorithm (world of one rank, tiny model), plus the learner's
micro-batch invariance and the PACS whole-group rule."""

import math

import numpy as np
import pytest
import torch

import algos
from launch.loop.metrics import StepTimes, step_row
from learner import batching
from learner.learner import Learner
from tests.learner.helpers import full_weights, make_cfg, make_groups

ALGOS = ["grpo", "rloo", "prime", "pure", "luffy", "pacs", "sft", "opd"]
# (algo, config overrides): every algorithm with defaults, plus the PRIME reference/update variant
CASES = [(a, {}) for a in ALGOS] + [("prime", {"prime": {"ref": "policy", "update": "double"}})]
COMMON_KEYS = {"loss/total", "optim/grad_norm", "optim/lr", "time/learner_compute_s", "throughput/learner_tokens_per_s",
               "staleness/mean", "staleness/max", "optim/steps", "reward/mean", "entropy"}
# every key of the driver's part of a row (`launch.loop.metrics.step_row`)
DRIVER_KEYS = set(step_row([], StepTimes(0.0, 0.0, 0.0, since_last_s=1.0, wall_s=1.0), {}, {}, version=0,
                           actor_restarts=0, buffer_restarts=0, actor_reports=[]))
ALGO_KEYS = {"prime": {"prime/prm_version", "prime/prm_loss", "prime/q_mean"},
             "pure": {"pure/min_step_score", "pure/num_steps"}, "luffy": {"luffy/offpolicy_frac"},
             "pacs": {"pacs/bce"}, "sft": {"loss/nll"}, "grpo": {"pg/clipfrac", "is/ess"},
             "opd": {"opd/reverse_kl", "opd/kl_adv"}}


def test_registry_names_match():
    assert sorted(ALGOS) == algos.names()


@pytest.mark.parametrize("algo,overrides", CASES, ids=[a + ("-variant" if o else "") for a, o in CASES])
def test_one_step_changes_weights_with_finite_metrics(algo, overrides, tiny_dir, teacher_dir, tokenizer, monkeypatch):
    cfg = make_cfg(algo, **overrides, **({"teacher": {"path": str(teacher_dir)}} if algo == "opd" else {}))
    learner = Learner(cfg, 0, 1, tiny_dir)
    groups = make_groups(tokenizer, 2, 4, version=3, demo_rows=1 if algo == "luffy" else 0)
    seen: list[list[int]] = []
    real = batching.make_microbatch
    monkeypatch.setattr(batching, "make_microbatch", lambda rows, idx, *a: seen.append(idx) or real(rows, idx, *a))
    before = full_weights(learner)
    m = learner.step(groups, version=3)
    after = full_weights(learner)
    changed = max(float(np.abs(after[k] - before[k]).max()) for k in before)
    assert changed > 1e-5, f"{algo}: weights did not move"
    assert COMMON_KEYS | ALGO_KEYS.get(algo, set()) <= set(m)
    # one writer per key: none of the driver's keys (the driver's row would refuse to merge)
    assert not m.keys() & DRIVER_KEYS, sorted(m.keys() & DRIVER_KEYS)
    bad = {k: v for k, v in m.items() if not math.isfinite(v)}
    assert not bad, bad
    assert m["optim/stepped"] == 1.0 and m["optim/lr"] == cfg.learner.lr
    # staleness: rows alternate versions 3 and 2 (helpers) → lag 0 or 1 at version 3.
    assert (m["staleness/min"], m["staleness/max"]) == (0.0, 1.0)
    if algo == "prime":
        assert m["prime/prm_version"] == 1.0
    if algo == "pacs":  # micro-batches of 4 rows = exactly one group of 4 each, never split
        assert all(idx is not None and len({i // 4 for i in idx}) == 1 and len(idx) == 4 for idx in seen)


def test_microbatch_size_does_not_change_the_update(tiny_dir, tokenizer):
    """Global normalisation: the same batch in 1 micro-batch of 16 rows or 8 of 2 gives one update
    (with an entropy bonus and a KL term to the frozen reference, so three normalised terms)."""
    groups = make_groups(tokenizer, 4, 4, version=1)
    weights, metrics = [], []
    for mb, fsdp in ((16, False), (2, True)):  # also: the FSDP2-wrapped model equals the plain one
        cfg = make_cfg("grpo", learner={"micro_batch_samples": mb, "batch_prompts": 4},
                       loss={"entropy_coef": 0.01, "kl_coef": 0.1, "agg": "seq-mean-token-mean"})
        learner = Learner(cfg, 0, 1, tiny_dir, fsdp=fsdp)
        learner.step(groups, version=1)
        metrics.append(learner.step(groups, version=2))  # second step: π_θ ≠ π_ref, ratios ≠ 1
        weights.append(full_weights(learner))
    assert metrics[0]["batch/microbatches_per_rank"] == 1 and metrics[1]["batch/microbatches_per_rank"] == 8
    for k in ("loss/total", "loss/pg", "loss/kl", "loss/entropy", "optim/grad_norm"):
        assert metrics[0][k] == pytest.approx(metrics[1][k], rel=2e-6, abs=1e-8), k
    assert abs(metrics[1]["loss/kl"]) > 1e-4  # k1 estimate: non-zero once π_θ moved away from π_ref
    # Adam moves almost every weight by ≈ lr = 1e-3 per step; elements whose gradient is ~1e-8 (Adam's
    # eps) amplify fp32 summation-order noise, so the bound is 1% of one step, not machine precision.
    for k in weights[0]:
        np.testing.assert_allclose(weights[0][k], weights[1][k], atol=1e-5, rtol=0, err_msg=k)


def test_missing_provider_is_a_clear_error(tiny_dir):
    cfg = make_cfg("luffy", luffy={"use_target_probs": True})
    with pytest.raises(ValueError, match="no provider for it.*target_probs|target_probs.*no provider"):
        Learner(cfg, 0, 1, tiny_dir)


def test_nonfinite_rewards_are_rejected_before_any_compute(tiny_dir, tokenizer):
    learner = Learner(make_cfg("grpo"), 0, 1, tiny_dir)
    groups = make_groups(tokenizer, 1, 4)
    groups[0].samples[2].reward = float("inf")
    w0 = full_weights(learner)
    with pytest.raises(ValueError, match="non-finite reward"):
        learner.step(groups, 0)
    assert all(torch.equal(torch.from_numpy(w0[k]), torch.from_numpy(v)) for k, v in full_weights(learner).items())


def test_activation_checkpointing_bf16_and_fsdp_at_one_rank(tiny_dir, tokenizer):
    """Recomputing activations changes nothing; bf16 compute (fp32 master weights; autocast for the
    plain module, MixedPrecisionPolicy under FSDP2) stays within bf16 rounding of the fp32 step."""
    groups = make_groups(tokenizer, 2, 4)
    out = {}
    for dtype, ac, fsdp in (("float32", False, False), ("float32", True, False), ("bfloat16", True, False),
                            ("bfloat16", False, True)):
        learner = Learner(make_cfg("grpo", model={"dtype": dtype}, learner={"activation_checkpointing": ac}),
                          0, 1, tiny_dir, fsdp=fsdp)
        out[dtype, ac, fsdp] = (learner.step(groups, 0), full_weights(learner))
        assert {str(t.dtype) for _, t in learner.named_full_weights()} == {"torch.float32"}  # fp32 masters
    (m32, w32), (m_ac, w_ac), (m16, _), (m16_fsdp, _) = out.values()
    assert m32["loss/total"] == m_ac["loss/total"] and m32["optim/grad_norm"] == m_ac["optim/grad_norm"]
    for k in w32:
        np.testing.assert_array_equal(w32[k], w_ac[k], err_msg=k)
    for m in (m16, m16_fsdp):
        assert m["optim/grad_norm"] == pytest.approx(m32["optim/grad_norm"], rel=3e-2)
        assert m["optim/grad_norm"] != m32["optim/grad_norm"]  # it really computed in bf16


def _poison(fn):
    def wrapped(*a, **k):
        loss, metrics = fn(*a, **k)
        return loss * float("nan"), metrics
    return wrapped


def test_nonfinite_gradient_skips_pacs_and_stops_grpo(tiny_dir, tokenizer, monkeypatch):
    import algos.pacs.maths
    import algos.policy_gradient

    groups = make_groups(tokenizer, 1, 4)
    monkeypatch.setattr(algos.pacs.maths, "pacs_row_losses", _poison(algos.pacs.maths.pacs_row_losses))
    pacs = Learner(make_cfg("pacs"), 0, 1, tiny_dir)
    w0 = full_weights(pacs)
    m = pacs.step(groups, 0)  # spec.skip_nonfinite_grad: skipped and counted
    assert (m["optim/stepped"], m["optim/skipped_steps"], pacs.optimizer_steps) == (0.0, 1.0, 1)
    assert all(np.array_equal(w0[k], v) for k, v in full_weights(pacs).items())
    monkeypatch.setattr(algos.policy_gradient, "ppo_clip_loss", _poison(algos.policy_gradient.ppo_clip_loss))
    grpo = Learner(make_cfg("grpo"), 0, 1, tiny_dir)
    with pytest.raises(FloatingPointError, match="grpo optimiser step 0: non-finite gradient norm"):
        grpo.step(groups, 0)
    assert all(np.array_equal(w0[k], v) for k, v in full_weights(grpo).items())


def test_token_ids_outside_the_vocabulary_are_rejected(tiny_dir, tokenizer):
    learner = Learner(make_cfg("grpo"), 0, 1, tiny_dir)
    groups = make_groups(tokenizer, 1, 4)
    groups[0].samples[1].tokens[3] = 5000
    with pytest.raises(ValueError, match=r"group 'g0' sample 1: token ids must lie in \[0, 103\)"):
        learner.step(groups, 0)
