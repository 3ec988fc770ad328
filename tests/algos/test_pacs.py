"""PACS: reference vectors (score, advantage, weights), golden examples, θ = θ_old, registry spec."""

from __future__ import annotations

import math

import pytest
import torch

import algos
from algos.aggregation import LossNorm
from algos.batch import LossContext, StepBatch
from algos.pacs import maths as pacs
from algos.pacs.maths import pacs_advantage, pacs_row_losses, pacs_score, pacs_weights
from tests.algos.cfg import make_cfg as _make_cfg
from tests.vectors import assert_close, cases


def make_cfg(**overrides):
    return _make_cfg("pacs", loss={"entropy_coef": 0.001}, **overrides)


# ---------------------------------------------------------------- reference vectors

@pytest.mark.parametrize("case", cases("pacs_reward.json"))
def test_score_vectors(case):
    cfg, i = case["config"], case["inputs"]
    expected = case["outputs"]["reward"][:, 0]
    args = (i["log_prob"], i["old_log_prob"], i["response_mask"], int(cfg["reward_method"]), cfg["beta"])
    # masked=False is the reference's unmasked sum over all columns
    assert_close(pacs_score(*args, masked=False), expected)
    masked = pacs_score(*args)  # our default
    if "nonzero_padding" in case["name"]:
        # padding log-probs are not 0 here, so the masked default must differ from the reference ...
        assert (masked - expected).abs().max() > 0.1
        # ... and equal the reference on the same inputs with the padding zeroed
        m = i["response_mask"].float()
        zeroed = (i["log_prob"] * m, i["old_log_prob"] * m, *args[2:])
        assert_close(masked, pacs_score(*zeroed, masked=False))
    else:
        assert_close(masked, expected)


@pytest.mark.parametrize("case", cases("pacs_advantage.json"))
def test_advantage_vectors(case):
    cfg = case["config"]
    scores = case["inputs"]["reward"][:, 0]
    n = cfg.get("rollout_n", 4)
    name = case["name"]
    estimator = "naive" if name == "naive" else name.split("_")[0]
    adv = pacs_advantage(scores, torch.arange(scores.shape[0]) // n, estimator,
                         use_std=cfg.get("norm_adv_by_std_in_grpo", True))
    assert_close(adv, case["outputs"]["advantage"][:, 0])


@pytest.mark.parametrize("case", cases("pacs_weight.json"))
def test_weight_vectors(case):
    cfg = case["config"]
    labels = case["inputs"]["score"][:, 0]
    w = pacs_weights(labels, torch.arange(labels.shape[0]) // cfg["rollout_n"], cfg["weight_mode"])
    assert_close(w, case["outputs"]["weight"][:, 0])


# ---------------------------------------------------------------- golden examples

def test_golden_bce_two_rows():
    # one group of 2, method 1, β = 1: r̂ = Σ(logπ − logπ_old) = [2·0.5, 2·1.5] = [1, 3]
    # rloo: Â = [1 − 3, 3 − 1] = [−2, 2]; labels [0, 1]; question weights: n/(2·1) = 1 each
    # BCE(−2, 0) = BCE(2, 1) = log(1 + e^−2) = 0.126928; mean over 2 rows = 0.126928
    old = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])
    lp = torch.tensor([[-0.5, -0.5], [-0.5, -0.5]])
    rows, metrics = pacs_row_losses(lp, old, torch.ones(2, 2), torch.tensor([0.0, 1.0]), torch.zeros(2).long())
    assert_close(rows, torch.full((2,), math.log1p(math.exp(-2.0))))
    assert_close(metrics["pacs/pred_acc"], torch.tensor(1.0))


def test_golden_weights_and_method2():
    # 1 positive of 3: w+ = 3/(2·1) = 1.5, w− = 3/(2·2) = 0.75; a one-label group: 1
    w = pacs_weights(torch.tensor([1.0, 0, 0, 1, 1]), torch.tensor([0, 0, 0, 1, 1]))
    assert_close(w, torch.tensor([1.5, 0.75, 0.75, 1.0, 1.0]))
    # method 2, β = 2: row [−1, −3, pad −7] with T = 2 → 2·(−4)/2 = −4; an empty row → 0 (not NaN)
    lp = torch.tensor([[-1.0, -3.0, -7.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert_close(pacs_score(lp, lp, mask, method=2, beta=2.0), torch.tensor([-4.0, 0.0]))


def test_grpo_and_naive_golden():
    # grpo over [1, 3]: mean 2, unbiased std sqrt(2) → ±1/sqrt(2) (eps 1e-6); naive: the scores
    s, gi = torch.tensor([1.0, 3.0]), torch.tensor([7, 7])  # sparse group ids are fine
    assert_close(pacs_advantage(s, gi, "grpo"), torch.tensor([-1.0, 1.0]) / (math.sqrt(2) + 1e-6))
    assert_close(pacs_advantage(s, gi, "grpo", use_std=False), torch.tensor([-1.0, 1.0]))
    assert_close(pacs_advantage(s, gi, "naive"), s)


def test_theta_equals_theta_old():
    """Â = 0 → loss = ln 2·mean(w); the gradient is (β/B)·Σ_i w_i(½ − v_i)·∇(ℓ_i − mean_{j≠i} ℓ_j) ≠ 0."""
    g = torch.Generator().manual_seed(0)
    b, t, n, beta = 6, 5, 3, 2.0
    old = -torch.rand(b, t, generator=g)
    mask = (torch.arange(t)[None] < torch.tensor([5, 3, 4, 2, 5, 1])[:, None]).float()
    v = torch.tensor([1.0, 0, 0, 1, 1, 0])
    gi = torch.arange(b) // n
    lp = old.clone().requires_grad_(True)
    rows, _ = pacs_row_losses(lp, old, mask, v, gi, method=1, beta=beta)
    loss = rows.mean()
    w = pacs_weights(v, gi)
    assert_close(loss, math.log(2.0) * w.mean())
    loss.backward()
    c = w * (0.5 - v)  # dBCE/dÂ at Â = 0, times the weight
    group_sum = torch.zeros(2).index_add_(0, gi, c)[gi]
    coef = (beta / b) * (c - (group_sum - c) / (n - 1))  # ∂loss/∂r̂_k · ∂r̂_k/∂logp = coef·M
    assert_close(lp.grad, coef[:, None] * mask)
    assert lp.grad.abs().sum() > 0.1


def test_edge_cases():
    # singleton group: rloo leaves r̂ unchanged, result finite
    rows, _ = pacs_row_losses(torch.tensor([[-0.5]]), torch.tensor([[-1.0]]), torch.ones(1, 1),
                              torch.tensor([1.0]), torch.tensor([0]))
    assert_close(rows, torch.tensor([math.log1p(math.exp(-0.5))]))
    with pytest.raises(ValueError, match="binary"):
        pacs_weights(torch.tensor([0.5, 1.0]), torch.tensor([0, 0]))
    assert_close(pacs_weights(torch.tensor([0.5, 1.0]), torch.tensor([0, 0]), "none"), torch.ones(2))
    for bad in (dict(method=3), dict(estimator="ppo"), dict(weight_mode="all")):
        args = dict(method=1, estimator="rloo", weight_mode="question") | bad
        with pytest.raises(ValueError):
            pacs_row_losses(torch.zeros(2, 1), torch.zeros(2, 1), torch.ones(2, 1), torch.tensor([0.0, 1.0]),
                            torch.tensor([0, 0]), **args)


# ---------------------------------------------------------------- registry interface

def _step_batch(b=8, t=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(t)[None] < torch.tensor([5, 3, 4, 2, 5, 1, 4, 5])[:b, None]).float()
    old = -torch.rand(b, t, generator=g)
    return StepBatch(response_mask=mask, prefix_mask=torch.zeros(b, t, dtype=torch.bool),
                     group_index=torch.arange(b) // 4, rewards=torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 0])[:b],
                     old_logprobs=old, behav_logprobs=old - 0.01)


def test_spec_runs_through_registry_interface():
    spec, cfg = algos.get("pacs"), make_cfg()
    assert spec.name == "pacs" and spec.advantage is None
    assert spec.whole_groups_per_microbatch and spec.skip_nonfinite_grad and not spec.clip_grad
    assert [c.name for c in spec.losses] == ["pacs_bce"] and spec.requires(cfg) == frozenset()
    assert algos.get("pacs") is spec
    batch = _step_batch()
    lp = (batch.old_logprobs + 0.05 * torch.randn(batch.old_logprobs.shape)).requires_grad_(True)
    ctx = LossContext(logprobs=lp, entropy=None, batch=batch, advantages=torch.zeros_like(lp),
                      norm=LossNorm.local(batch.response_mask))
    for comp in spec.losses:
        assert comp.weight(cfg) == 1.0
        term = comp.fn(ctx, cfg)
        assert term.loss.dim() == 0 and torch.isfinite(term.loss)
        assert term.metrics["pacs/singleton_row_frac"] == 0
        assert "pacs/bce" in term.metrics and all(torch.isfinite(v) for v in term.metrics.values())
        (grad,) = torch.autograd.grad(term.loss, lp)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
        # padding never receives gradient (masked score)
        assert (grad * (1 - batch.response_mask)).abs().sum() == 0


def test_microbatches_of_whole_groups_match_full_batch():
    batch, cfg = _step_batch(), make_cfg(estimator="grpo", method=2, beta=2.0)
    lp = batch.old_logprobs + 0.1
    norm = LossNorm.local(batch.response_mask)
    full = pacs.BCE.fn(LossContext(lp, None, batch, torch.zeros_like(lp), norm), cfg).loss
    parts = sum(pacs.BCE.fn(LossContext(lp[idx], None, batch.rows(idx), torch.zeros_like(lp[idx]), norm), cfg).loss
                for idx in (torch.arange(4), torch.arange(4, 8)))
    assert_close(parts, full)


def test_row_importance_weight_golden():
    """Row 0: on-policy log-ratios (π_prox − μ) 0.2 and 0.4 → mean 0.3, s = e^0.3 = 1.34986; row 1: −1.0 and
    −2.0 (the third token is padding) → mean −1.5, s = e^−1.5 = 0.22313; row 2 has no on-policy token → s = 1.
    tis (C = 1.2): min(s, C) = (1.2, 0.22313, 1), row 0 truncated; mask [0.5, 5]: row 1 dropped; none: 1."""
    prox = torch.tensor([[0.2, 0.4, 9.0], [-1.0, -2.0, 7.0], [3.0, 3.0, 3.0]])
    behav = torch.zeros(3, 3)
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 0], [0, 0, 0]])
    s = pacs.sequence_ratio(prox, behav, mask)
    assert_close(s, torch.tensor([math.exp(0.3), math.exp(-1.5), 1.0]))
    w, hit = pacs.row_importance_weight(s, "tis", cap=1.2)
    assert_close(w, torch.tensor([1.2, math.exp(-1.5), 1.0])) and hit.tolist() == [True, False, False]
    w, hit = pacs.row_importance_weight(s, "mask", cap_min=0.5, cap_max=5.0)
    assert w.tolist() == [1.0, 0.0, 1.0] and hit.tolist() == [False, True, False]
    w, hit = pacs.row_importance_weight(s, "none")
    assert w.tolist() == [1.0, 1.0, 1.0] and not hit.any()
    with pytest.raises(ValueError, match="decouples a PPO clip and PACS has none"):
        pacs.row_importance_weight(s, "decoupled")


def test_bce_applies_the_row_correction_logs_core_metrics_and_filters_truncated_rows():
    """The loss with is_correction=tis equals Σ_i min(s_i, C)·w_i·BCE_i / B; is/*, mismatch/kl and pg/ppo_kl
    are logged; under loss.overlong_filter a truncated row's BCE leaves the sum (its score still enters
    the group's baseline, as DAPO keeps filtered rows in the advantage)."""
    batch = _step_batch()
    batch.behav_logprobs = batch.old_logprobs - torch.linspace(-1.0, 1.0, 8)[:, None]  # s_i = e^{d_i}
    lp = (batch.old_logprobs + 0.05).requires_grad_(True)
    norm = LossNorm.local(batch.response_mask)
    ctx = LossContext(lp, None, batch, torch.zeros_like(lp), norm)
    rows, _ = pacs_row_losses(lp, batch.old_logprobs, batch.response_mask, batch.rewards, batch.group_index)
    d = torch.linspace(-1.0, 1.0, 8)
    want = (rows * torch.clamp(torch.exp(d), max=2.0)).sum() / 8
    term = pacs.BCE.fn(ctx, make_cfg())
    assert_close(term.loss, want)
    assert {"is/weight_mean", "is/ess", "mismatch/kl", "pg/ppo_kl", "pacs/is_row_clip_frac"} <= set(term.metrics)
    assert "is/clip_frac" not in term.metrics
    assert_close(term.metrics["pg/ppo_kl"], torch.tensor(-0.05))  # log π_prox − log π_θ = −0.05 everywhere
    # d_i = −1 + 2i/7: e^{d_i} > C = 2 iff d_i > ln 2 = 0.693, i.e. rows 6 (d = 0.714) and 7 (d = 1): 2 of 8
    assert_close(term.metrics["pacs/is_row_clip_frac"], torch.tensor(0.25))
    batch.truncated = torch.tensor([False, True, False, False, False, False, False, False])
    cfg = make_cfg()
    cfg.loss.overlong_filter = True
    kept = torch.ones(8)
    kept[1] = 0.0
    assert_close(pacs.BCE.fn(ctx, cfg).loss, (rows * torch.clamp(torch.exp(d), max=2.0) * kept).sum() / 8)
