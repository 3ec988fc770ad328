"""LUFFY: reference vectors (advantage, mixed loss, prefix rollout), golden examples, registry spec."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

import algos
from algos.aggregation import LossNorm
from algos.batch import LossContext, StepBatch
from algos.luffy import maths as luffy
from algos.luffy.loss import luffy_token_loss, off_policy_shape, on_policy_ratio, parse_reshape
from algos.luffy.maths import extreme_group_keep, luffy_advantage, luffy_policy_loss
from algos.luffy.prefix import (
    guided_prompt,
    prefix_length,
    prefix_ratio_windows,
    prefix_ratios,
    prefix_ratios_from_cfg,
    strip_padding,
    window_index,
)
from tests.algos.cfg import make_cfg as _make_cfg
from tests.reference.luffy import assemble_response
from tests.vectors import assert_close, cases, group_ids, load


def make_cfg(**luffy_overrides):
    return _make_cfg("luffy", loss={"entropy_coef": 0.001}, **luffy_overrides)


# ---------------------------------------------------------------- reference vectors: advantage

@pytest.mark.parametrize("case", cases("luffy_grpo_advantage.json"))
def test_advantage_vectors(case):
    cfg, i = case["config"], case["inputs"]
    mask = i["response_mask"]
    if "on_policy_mask" in i:  # a row-level flag: an off-policy row is demonstration on every token
        prefix = (~i["on_policy_mask"].bool())[:, None] & (mask > 0)
    else:
        prefix = i["prefix_mask"].bool()
    rewards = i["token_level_rewards"].sum(-1)
    adv, _ = luffy_advantage(rewards, group_ids(i["index"]), prefix, mask, estimator=cfg["estimator"],
                             use_std=cfg["use_std"], eps=cfg.get("epsilon", 1e-6), filter_extreme=False)
    assert_close(adv, case["outputs"]["advantages"])


# ---------------------------------------------------------------- reference vectors: mixed loss

def _reference_options(cfg: dict, inputs: dict) -> dict:
    """The reference function's own defaults for options a case's config does not name."""
    return dict(
        clip_low=cfg["cliprange"], clip_high=cfg["cliprange"], clip_upper_bound=cfg["clip_upper_bound"],
        remove_clip=cfg.get("loss_remove_clip", False),
        off_policy_reshape=cfg.get("off_policy_reshape", "no_reshape"),
        off_policy_reshape_weight=cfg.get("off_policy_reshape_weight", 1.0),
        off_policy_reshape_pow_exp=cfg.get("off_policy_reshape_pow_exp", 0.5),
        on_policy_reshape=cfg.get("on_policy_reshape", "no_reshape"),
        on_policy_reshape_weight=cfg.get("on_policy_reshape_weight", 1.0),
        on_policy_reshape_pow_exp=cfg.get("on_policy_reshape_pow_exp", 0.5),
        off_max_clip=cfg.get("off_max_clip"), off_min_clip=cfg.get("off_min_clip"),
        all_max_clip=cfg.get("all_max_clip"), target_probs=inputs.get("target_probs"),
    )


def _agg(cfg: dict) -> str:
    # the reference's loss_remove_token_mean=True is Σ ℓ·M / T_pad
    return "seq-mean-token-sum-norm" if cfg.get("loss_remove_token_mean") else "token-mean"


@pytest.mark.parametrize("case", cases("luffy_off_policy_loss.json"))
def test_mixed_loss_vectors(case):
    cfg, i, o = case["config"], case["inputs"], case["outputs"]
    loss, metrics = luffy_policy_loss(i["log_prob"], i["old_log_prob"], i["advantages"], i["eos_mask"],
                                      i["prefix_mask"], _agg(cfg), None, **_reference_options(cfg, i))
    assert_close(loss, o["pg_loss"])
    assert set(metrics) == set(o) - {"pg_loss"}
    for name, value in metrics.items():
        assert_close(value, o[name])


@pytest.mark.parametrize("case", [c for c in cases("luffy_off_policy_loss.json")
                                  if "all_max_clip" not in c.values[0]["config"]])
def test_registered_component_matches_reference_without_is(case):
    """Through the registry component with is_correction="none" and single-batch norms: the reference."""
    vc, i, o = case["config"], case["inputs"], case["outputs"]
    opts = _reference_options(vc, i)
    cfg = make_cfg(**{k: v for k, v in opts.items() if k not in ("clip_low", "clip_high", "target_probs")},
                   use_target_probs=i.get("target_probs") is not None)
    cfg.loss.is_correction, cfg.loss.agg = "none", _agg(vc)
    cfg.loss.clip_low = cfg.loss.clip_high = vc["cliprange"]
    b, t = i["log_prob"].shape
    extras = {"target_probs": i["target_probs"]} if "target_probs" in i else {}
    batch = StepBatch(response_mask=i["eos_mask"].float(), prefix_mask=i["prefix_mask"].bool(),
                      group_index=torch.zeros(b, dtype=torch.int64), rewards=torch.zeros(b),
                      old_logprobs=i["old_log_prob"], behav_logprobs=i["old_log_prob"] - 1.0, extras=extras)
    ctx = LossContext(logprobs=i["log_prob"], entropy=None, batch=batch, advantages=i["advantages"],
                      norm=LossNorm.local(i["eos_mask"]))
    term = luffy.MIXED_PG.fn(ctx, cfg)
    assert_close(term.loss, o["pg_loss"])
    assert_close(term.metrics["luffy/off_pg_loss"], o["off_pg_loss"])


def test_loss_vectors_can_fail():
    """The comparison is sensitive: the paper default reshape differs from the reference's no_reshape."""
    c = load("luffy_off_policy_loss.json")["cases"][0]
    v = cases("luffy_off_policy_loss.json")[0].values[0]
    opts = _reference_options(c["config"], v["inputs"]) | {"off_policy_reshape": "p_div_p_0.5"}
    i = v["inputs"]
    loss, _ = luffy_policy_loss(i["log_prob"], i["old_log_prob"], i["advantages"], i["eos_mask"],
                                i["prefix_mask"], "seq-mean-token-sum-norm", None, **opts)
    assert abs(float(loss) - float(v["outputs"]["pg_loss"])) > 1e-3


# ---------------------------------------------------------------- reference vectors: prefix rollout

@pytest.mark.parametrize("case", cases("luffy_prefix_rollout.json"))
def test_prefix_rollout_vectors(case):
    cfg, i, o = case["config"], case["inputs"], case["outputs"]
    n, pad, eos, t = cfg["n"], i["pad_id"], i["eos_id"], cfg["response_length"]
    # The "random" cases are reproduced exactly: the reference draws python `random.uniform` after
    # random.seed(0), one draw per guided row in row order, which is what random.Random(0) gives us.
    rng = random.Random(0)
    # "step251" is the reference's 1-based global step; windows/linear use global_steps − 1 = our step.
    step = 250 if "step251" in case["name"] else 0
    luffy_cfg = SimpleNamespace(prefix_strategy=cfg["prefix_strategy"], n_prefix=cfg["n_prefix"],
                                min_prefix_ratio=cfg["min_prefix_ratio"], max_prefix_ratio=cfg["max_prefix_ratio"],
                                prefix_steps=cfg["prefix_steps"], prefix_linear_max_ratio=cfg["prefix_linear_max_ratio"],
                                prefix_share_across_samples=cfg["prefix_share_across_samples"])
    prompts = i["prompt_ids"]
    ratios = [r for _ in range(prompts.shape[0]) for r in prefix_ratios_from_cfg(luffy_cfg, n, step, rng)]
    assert ratios == pytest.approx(o["prefix_ratios"], abs=1e-12)

    engine, responses, prefix_masks, masks = [], [], [], []
    for row, ratio in enumerate(ratios):
        prompt = strip_padding(prompts[row // n], pad, left=True)
        target = strip_padding(i["tgt_input_ids"][row // n], pad, left=False)
        engine_prompt, prefix = guided_prompt(prompt, target, eos, ratio)
        continuation = [60 + row] * (1 + row % 3) + [eos]  # the vector's fake engine
        built = assemble_response(prefix, continuation, eos, t, pad)
        engine.append(engine_prompt)
        responses.append(built.response)
        prefix_masks.append(built.prefix_mask)
        masks.append(built.response_mask)
    assert engine == o["engine_prompt_token_ids"]
    assert torch.equal(torch.stack(responses), o["responses"])
    assert torch.equal(torch.stack(prefix_masks), o["prefix_mask"])
    p = prompts.shape[1]
    attn = o["attention_mask"]
    assert torch.equal(torch.stack(masks).long(), attn[:, p:])
    assert torch.equal((prompts != pad).long().repeat_interleave(n, dim=0), attn[:, :p])


def test_prefix_window_tables():
    tables = load("luffy_prefix_rollout.json")["semantics"]["windows_for_prefix_steps_1000_maxratio_0.8"]
    for strategy in ("linear_max", "reverse_linear"):
        steps, ratios = prefix_ratio_windows(strategy, 1000, 0.8)
        assert [list(s) for s in steps] == tables[strategy]["prefix_step_windows"]
        assert [list(r) for r in ratios] == tables[strategy]["prefix_ratio_windows"]
    fixed = prefix_ratios("fixed", 4, 4, 0, random.Random(0), min_ratio=0.1, max_ratio=0.7)
    assert fixed == tables["fixed"]["prefix_fix_ratios"]


# ---------------------------------------------------------------- golden examples

def test_golden_grpo_split_advantage_with_alpha():
    # one group: row 0 guided (2 prefix tokens, then 1 generated), rows 1-3 on-policy; rewards 1,1,0,0.
    # on-policy rewards [1,0,0]: mean 1/3, unbiased std sqrt(((2/3)^2 + 2·(1/3)^2)/2) = sqrt(1/3).
    # A(reward 1) = (2/3)/sqrt(1/3) = 1.1547005, A(reward 0) = −(1/3)/sqrt(1/3) = −0.5773503.
    # α = 0.5 halves the guided row's prefix tokens only: [0.57735, 0.57735, 1.1547005].
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    prefix = torch.zeros(4, 3, dtype=torch.bool)
    prefix[0, :2] = True
    adv, metrics = luffy_advantage(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.int64), prefix,
                                   mask, alpha=0.5, eps=0.0)
    hi, lo = (2 / 3) / math.sqrt(1 / 3), -(1 / 3) / math.sqrt(1 / 3)
    expected = torch.tensor([[hi / 2, hi / 2, hi], [hi, hi, 0], [lo, 0, 0], [lo, lo, lo]])
    assert_close(adv, expected)
    assert_close(metrics["luffy/offpolicy_frac"], torch.tensor(2 / 9))


def test_group_without_on_policy_row_raises():
    prefix = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="no on-policy row"):
        luffy_advantage(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.int64), prefix, torch.ones(2, 3))


def test_extreme_group_filter():
    rewards = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0])
    gi = torch.arange(12) // 4
    keep = extreme_group_keep(rewards, gi)
    assert keep.tolist() == [False] * 8 + [True] * 4
    # singleton group d (reward 1) of the grpo vector is extreme: filtered → 0 instead of 1/(1+1e-6)
    adv, m = luffy_advantage(torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0, 0, 1]),
                             torch.zeros(3, 2, dtype=torch.bool), torch.ones(3, 2), estimator="grpo")
    assert adv[2].abs().sum() == 0 and adv[0].abs().sum() > 0
    assert_close(m["luffy/extreme_row_frac"], torch.tensor(1 / 3))


def test_golden_mixed_loss():
    # token 0: off-policy, p = 0.4, A = 2 → f = 0.4/(0.4+0.1) = 0.8, ℓ = −1.6
    # token 1: on-policy, ratio 1.5, A = 1 → max(−1.5, −1·clip(1.5, 0.8, 1.2)) = −1.2
    # token-mean over 2 tokens: −1.4;  Σ/T_pad with T_pad = 4: −2.8/4 = −0.7
    # remove_clip: (−1.6 − 1.5)/2 = −1.55;  clip_upper_bound 2 → upper max(2, 1.2) = 2: same −1.55
    lp = torch.tensor([[math.log(0.4), math.log(0.3), 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[math.log(0.9), math.log(0.2), 0.0, 0.0]])
    adv = torch.tensor([[2.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    pre = torch.tensor([[True, False, False, False]])
    loss, _ = luffy_policy_loss(lp, old, adv, mask, pre, "token-mean")
    assert_close(loss, torch.tensor(-1.4))
    assert_close(luffy_policy_loss(lp, old, adv, mask, pre, "seq-mean-token-sum-norm")[0], torch.tensor(-0.7))
    assert_close(luffy_policy_loss(lp, old, adv, mask, pre, "token-mean", remove_clip=True)[0], torch.tensor(-1.55))
    assert_close(luffy_policy_loss(lp, old, adv, mask, pre, "token-mean", clip_upper_bound=2.0)[0],
                 torch.tensor(-1.55))
    # gradient of the off-policy token: d/dlogp [−A·p/(p+γ)] = −A·γp/(p+γ)² = −2·0.04/0.25 = −0.32, /2 tokens
    # the on-policy token is clipped → no gradient
    loss.backward()
    assert_close(lp.grad, torch.tensor([[-0.16, 0.0, 0.0, 0.0]]))


def test_golden_is_correction_on_on_policy_tokens_only():
    # same tokens as above; μ makes π_prox/μ = 3 on the generated token → tis caps at 2:
    # (−1.6 + 2·(−1.2))/2 = −2.0; a μ on the demonstration token is ignored.
    cfg = make_cfg()
    lp = torch.tensor([[math.log(0.4), math.log(0.3)]])
    old = torch.tensor([[math.log(0.9), math.log(0.2)]])
    batch = StepBatch(response_mask=torch.ones(1, 2), prefix_mask=torch.tensor([[True, False]]),
                      group_index=torch.zeros(1, dtype=torch.int64), rewards=torch.ones(1), old_logprobs=old,
                      behav_logprobs=torch.tensor([[-9.0, math.log(0.2 / 3)]]))
    ctx = LossContext(logprobs=lp, entropy=None, batch=batch, advantages=torch.tensor([[2.0, 1.0]]),
                      norm=LossNorm.local(torch.ones(1, 2)))
    assert_close(luffy.MIXED_PG.fn(ctx, cfg).loss, torch.tensor(-2.0))
    cfg.loss.is_correction = "none"
    assert_close(luffy.MIXED_PG.fn(ctx, cfg).loss, torch.tensor(-1.4))


def test_reshapes():
    lp, old = torch.tensor([math.log(0.25)]), torch.tensor([math.log(0.5)])
    assert_close(off_policy_shape(lp, "p_div_p_0.25"), torch.tensor([0.5]))
    assert_close(off_policy_shape(lp, "p_logp", weight=0.1), torch.tensor([0.25 + 0.1 * math.log(0.25)]))
    assert_close(off_policy_shape(lp, "pow", pow_exp=0.5), torch.tensor([0.5]))
    assert_close(on_policy_ratio(lp, old, "square_root"), torch.tensor([math.sqrt(0.5)]))
    assert_close(on_policy_ratio(lp, old, "logp"), torch.tensor([math.log(0.5)]))
    # p_div_p_1: (0.25/1.25)/(0.5/1.5) = 0.6
    assert_close(on_policy_ratio(lp, old, "p_div_p_1"), torch.tensor([0.6]))
    for bad in ("p_div_p_", "p_div_p_-1", "p_div_p_x", "sqrt"):
        with pytest.raises(ValueError):
            parse_reshape(bad)


# ---------------------------------------------------------------- prefix strategies

def test_prefix_strategies():
    rng = random.Random(1)
    assert prefix_length(8, 0.7066531109150289) == 5 and prefix_length(4, 1.0) == 4 and prefix_length(0, 0.5) == 0
    with pytest.raises(ValueError):
        prefix_length(4, 1.5)
    assert prefix_ratios("fixed", 4, 1, 0, rng, min_ratio=0.3, max_ratio=0.9) == [0.3, 0, 0, 0]
    assert prefix_ratios("random", 3, -1, 0, rng, min_ratio=0.5, max_ratio=0.5) == [0.5] * 3
    assert prefix_ratios("linear", 2, 1, 5000, rng) == [0.0, 0.0]  # past prefix_steps
    shared = prefix_ratios("reverse_linear", 4, 3, 0, rng, share_across_samples=True)
    assert len(set(shared[:3])) == 1 and 0 <= shared[0] <= 0.08 and shared[3] == 0
    assert window_index(100, prefix_ratio_windows("linear_max", 1000, 0.8)[0]) == 0  # inclusive upper end
    assert window_index(5000, prefix_ratio_windows("linear_max", 1000, 0.8)[0]) == 9
    for bad in (dict(strategy="nope"), dict(n_prefix=5), dict(min_ratio=0.9, max_ratio=0.1)):
        args = dict(strategy="random", n=4, n_prefix=1, step=0, rng=rng) | bad
        with pytest.raises(ValueError):
            prefix_ratios(args.pop("strategy"), args.pop("n"), args.pop("n_prefix"), args.pop("step"),
                          args.pop("rng"), **args)


def test_random_ratio_statistics_torch_generator():
    g = torch.Generator().manual_seed(0)
    draws = [r for _ in range(500) for r in prefix_ratios("random", 4, 2, 0, g, min_ratio=0.2, max_ratio=0.8)[:2]]
    assert min(draws) >= 0.2 and max(draws) <= 0.8
    assert abs(sum(draws) / len(draws) - 0.5) < 0.02  # U(0.2, 0.8): mean 0.5, sd of the mean ≈ 0.0055


def test_assemble_truncates_and_masks():
    row = assemble_response([5, 6, 7], [8, 2, 9], eos_id=2, response_length=4, pad_id=0)
    assert row.response.tolist() == [5, 6, 7, 8] and row.response_mask.tolist() == [1, 1, 1, 1]
    assert row.prefix_mask.tolist() == [True, True, True, False]
    row = assemble_response([], [4], eos_id=2, response_length=3, pad_id=0)  # no eos: real tokens only
    assert row.response_mask.tolist() == [1, 0, 0] and not row.prefix_mask.any()


# ---------------------------------------------------------------- registry interface

def _step_batch(b=8, t=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 4, 5, 3, 6, 2, 5, 4])[:b]
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    prefix = torch.zeros(b, t, dtype=torch.bool)
    prefix[0, :6] = True  # group 0: a full demonstration row
    prefix[4, :3] = True  # group 1: a guided row, prefix then continuation
    old = -torch.rand(b, t, generator=g) * 2
    behav = (old + 0.1 * torch.randn(b, t, generator=g)) * (~prefix)
    return StepBatch(response_mask=mask, prefix_mask=prefix, group_index=torch.arange(b) // 4,
                     rewards=torch.tensor([1.0, 0, 1, 0, 1, 1, 0, 0])[:b], old_logprobs=old,
                     behav_logprobs=behav, ref_logprobs=old - 0.05, step=3)


def test_spec_runs_through_registry_interface():
    spec, cfg = algos.get("luffy"), make_cfg()
    assert spec.name == "luffy" and spec.requires(cfg) == frozenset() and algos.get("luffy") is spec
    cfg_kl = make_cfg()
    cfg_kl.loss.kl_coef = 0.1
    assert spec.requires(cfg_kl) == frozenset({"ref_logprobs"})
    assert spec.requires(make_cfg(use_target_probs=True)) == frozenset({"target_probs"})
    batch = _step_batch()
    with torch.no_grad():
        adv, metrics = spec.advantage(batch, cfg)
    assert adv.shape == batch.response_mask.shape and torch.isfinite(adv).all()
    assert all(torch.isfinite(v) for v in metrics.values())
    lp = (batch.old_logprobs + 0.1).clone().requires_grad_(True)
    ent = torch.rand(batch.response_mask.shape).requires_grad_(True)
    ctx = LossContext(logprobs=lp, entropy=ent, batch=batch, advantages=adv, norm=LossNorm.local(batch.response_mask))
    names = []
    for comp in spec.losses:
        term = comp.fn(ctx, cfg)
        names.append(comp.name)
        assert term.loss.dim() == 0 and torch.isfinite(term.loss)
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in term.metrics.values())
        carrier = ent if comp.needs_entropy else lp
        (grad,) = torch.autograd.grad(term.loss, carrier)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0, comp.name
    assert names == ["luffy_pg", "entropy", "kl"]
    assert "luffy/offpolicy_frac" in metrics


def test_target_probs_must_be_provided():
    batch = _step_batch()
    cfg = make_cfg(use_target_probs=True)
    ctx = LossContext(logprobs=batch.old_logprobs, entropy=None, batch=batch,
                      advantages=torch.ones_like(batch.old_logprobs), norm=LossNorm.local(batch.response_mask))
    with pytest.raises(ValueError, match="target_probs"):
        luffy.MIXED_PG.fn(ctx, cfg)


def test_microbatch_split_matches_full_batch():
    """Global norm: the sum of the micro-batch losses equals the full-batch loss (token-mean)."""
    batch, cfg = _step_batch(), make_cfg()
    adv, _ = algos.get("luffy").advantage(batch, cfg)
    lp = batch.old_logprobs + 0.3
    norm = LossNorm.local(batch.response_mask)
    full = luffy.MIXED_PG.fn(LossContext(lp, None, batch, adv, norm), cfg).loss
    parts = 0.0
    for idx in (torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5, 6, 7])):
        parts = parts + luffy.MIXED_PG.fn(LossContext(lp[idx], None, batch.rows(idx), adv[idx], norm), cfg).loss
    assert_close(parts, full)


def test_empty_rows_and_no_demonstration_tokens_stay_finite():
    """An empty row (T_i = 0) and a micro-batch without demonstration tokens: finite loss and metrics."""
    batch, cfg = _step_batch(), make_cfg()
    batch.response_mask[3] = 0.0
    adv, _ = algos.get("luffy").advantage(batch, cfg)
    idx = torch.tensor([1, 2, 3])  # on-policy rows only, one of them empty
    lp = (batch.old_logprobs[idx] + 0.2).requires_grad_(True)
    ctx = LossContext(lp, None, batch.rows(idx), adv[idx], LossNorm.local(batch.response_mask))
    term = luffy.MIXED_PG.fn(ctx, cfg)
    assert torch.isfinite(term.loss) and all(torch.isfinite(v) for v in term.metrics.values())
    assert term.metrics["luffy/off_pg_loss"] == 0 and term.metrics["luffy/off_policy_prob"] == 0
    term.loss.backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[2].abs().sum() == 0


# ---------------------------------------------------------------- one-sided micro-batches, clip scope

def _one_row_ctx(prefix: bool, lp, old, adv, cfg_is="tis"):
    cfg = make_cfg()
    cfg.loss.is_correction = cfg_is
    t = lp.shape[-1]
    batch = StepBatch(response_mask=torch.ones(1, t), prefix_mask=torch.full((1, t), prefix),
                      group_index=torch.zeros(1, dtype=torch.int64), rewards=torch.ones(1), old_logprobs=old,
                      behav_logprobs=torch.zeros(1, t) if prefix else old)
    lp = lp.clone().requires_grad_(True)
    return cfg, lp, LossContext(logprobs=lp, entropy=None, batch=batch, advantages=adv,
                                norm=LossNorm.local(torch.ones(1, t)))


def test_golden_microbatch_without_on_policy_rows_is_finite():
    # Demonstration-only micro-batch (the reference's on_pg_loss is 0/0 = NaN there):
    # p = (0.5, 0.9), A = 1, f = p/(p+0.1) = (0.5/0.6, 0.9/1.0) = (0.8333333, 0.9);
    # token-mean = −(0.8333333 + 0.9)/2 = −0.8666667. π_old = 0.2 makes ρ_on = 2.5 and 4.5 on these tokens
    # (clipped branch active for the metric only): on_pg_clipfrac = 2/2 = 1 (see test below).
    lp = torch.log(torch.tensor([[0.5, 0.9]]))
    old = torch.full((1, 2), math.log(0.2))
    cfg, lp, ctx = _one_row_ctx(True, lp, old, torch.ones(1, 2))
    term = luffy.MIXED_PG.fn(ctx, cfg)
    assert_close(term.loss, torch.tensor(-0.8666667))
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in term.metrics.values())
    assert term.metrics["luffy/on_pg_loss"] == 0 and term.metrics["luffy/on_policy_prob"] == 0
    assert_close(term.metrics["luffy/off_pg_loss"], torch.tensor(-0.8666667))
    assert_close(term.metrics["luffy/on_pg_clipfrac"], torch.tensor(1.0))
    term.loss.backward()
    # d/dlog p [−p/(p+0.1)] = −0.1p/(p+0.1)²: −0.05/0.36 = −0.1388889, −0.09/1.0 = −0.09; /2 tokens
    assert_close(lp.grad, torch.tensor([[-0.1388889 / 2, -0.09 / 2]]))


def test_golden_microbatch_without_off_policy_rows_is_finite():
    # Generated-only micro-batch: log π_θ − log π_old = (0.5, 0), A = 1, ε = 0.2 →
    # ρ = (e^0.5 = 1.6487, 1) → ℓ = (−1.2 clipped, −1); token-mean = −1.1; on_pg_clipfrac = 1/2.
    old = torch.full((1, 2), math.log(0.3))
    lp = old + torch.tensor([[0.5, 0.0]])
    cfg, lp, ctx = _one_row_ctx(False, lp, old, torch.ones(1, 2), cfg_is="none")
    term = luffy.MIXED_PG.fn(ctx, cfg)
    assert_close(term.loss, torch.tensor(-1.1))
    assert term.metrics["luffy/off_pg_loss"] == 0 and term.metrics["luffy/off_ratio_mean"] == 0
    assert_close(term.metrics["luffy/on_pg_clipfrac"], torch.tensor(0.5))
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in term.metrics.values())


_OFF_OPTIONS = [
    {},
    {"off_policy_reshape": "no_reshape"},
    {"off_policy_reshape": "logp", "off_policy_reshape_weight": 0.5},
    {"off_policy_reshape": "pow", "off_policy_reshape_pow_exp": 0.3},
    {"off_max_clip": 0.5, "off_min_clip": 0.1},
    {"target_probs": torch.tensor([[0.7, 0.0]])},
]


@pytest.mark.parametrize("off", _OFF_OPTIONS, ids=range(len(_OFF_OPTIONS)))
def test_off_policy_options_never_touch_the_on_policy_clip(off):
    # token 0: demonstration, p = 0.5; token 1: generated, ρ_on = e^0.5 = 1.6487212, A = 1.
    # On-policy loss with the clip: −1.2 (range [0.8, 1.2]); remove_clip (reference loss_remove_clip):
    # −1.6487212. Whatever the off-policy options, token 1's loss and the clip fraction stay these.
    lp = torch.tensor([[math.log(0.5), math.log(0.3) + 0.5]])
    old = torch.tensor([[math.log(0.5), math.log(0.3)]])
    pre = torch.tensor([[True, False]])
    for remove_clip, want, frac in ((False, -1.2, 0.5), (True, -math.exp(0.5), 0.0)):
        out = luffy_token_loss(lp, old, torch.ones(1, 2), torch.ones(1, 2), pre, remove_clip=remove_clip, **off)
        assert_close(out.loss[0, 1], torch.tensor(want))
        assert_close(out.metrics["on_pg_clipfrac"], torch.tensor(frac))
    # the demonstration token is never clipped: its loss is −A·f(p) with the default f = p/(p+0.1)
    if not off:
        assert_close(out.loss[0, 0], torch.tensor(-0.5 / 0.6))


def test_on_pg_clipfrac_counts_demonstration_tokens():
    # Documented meaning (the reference's): numerator = response tokens whose on-policy clipped branch
    # is active, demonstration tokens included; denominator = all response tokens.
    # token 0: demonstration with π_θ/π_old = e^0.5 (outside [0.8, 1.2]); token 1: generated, ratio 1.
    # No generated token is clipped, yet on_pg_clipfrac = 1/2.
    lp = torch.tensor([[math.log(0.5) + 0.5, math.log(0.3)]])
    old = torch.tensor([[math.log(0.5), math.log(0.3)]])
    out = luffy_token_loss(lp, old, torch.ones(1, 2), torch.ones(1, 2), torch.tensor([[True, False]]))
    assert_close(out.metrics["on_pg_clipfrac"], torch.tensor(0.5))
    assert out.metrics["off_pg_clipfrac"] == 0


def test_all_max_clip_rejects_the_reference_off_sentinel():
    with pytest.raises(ValueError):
        make_cfg(all_max_clip=-1.0)
    assert make_cfg(all_max_clip=0.99).luffy.all_max_clip == 0.99
