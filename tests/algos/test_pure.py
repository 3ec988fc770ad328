"""PURE: min-form vectors, step splitting, strict min-form brute force, baselines, fusion, spec."""

import math

import pytest
import torch

import algos
from algos.batch import StepBatch
from algos.pure.maths import (
    check_step_ends,
    kl_in_reward,
    process_baseline,
    pure_advantage,
    pure_main_normalize,
    step_score_metrics,
    verl_baseline,
)
from algos.pure.options import pure_requirements
from algos.pure.steps import (
    minform_rewards,
    minform_weights,
    process_returns,
    scores_from_logits,
    split_steps,
    step_spans,
    strict_min_returns,
)
from tests.algos.cfg import backprop_all_losses, make_cfg
from tests.reference.pure import verl_rloo_advantage
from tests.vectors import assert_close, cases

# ---------------------------------------------------------------- reference vectors


@pytest.mark.parametrize("case", cases("pure_minform.json"))
def test_minform_vectors(case):
    i, cfg, out = case["inputs"], case["config"], case["outputs"]
    p = scores_from_logits(i["logits"])
    r = minform_rewards(p, i["step_mask"], cfg["temperature"], uniform=cfg["disable_weighted_reward"])
    assert_close(r, out["weighted_step_reward"])
    assert_close(r.sum(-1), out["outcome_reward"])


@pytest.mark.parametrize("case", cases("pure_minform.json"))
def test_minform_token_layout_equals_step_layout(case):
    # The same steps scattered onto token positions (step k ends at token 2k+1) give the same rewards.
    i, cfg = case["inputs"], case["config"]
    p = scores_from_logits(i["logits"])
    b, k = p.shape
    ends = torch.zeros(b, 2 * k, dtype=torch.bool)
    ends[:, 1::2] = i["step_mask"]
    scores = torch.zeros(b, 2 * k)
    scores[:, 1::2] = p
    r_tok = minform_rewards(scores, ends, cfg["temperature"], uniform=cfg["disable_weighted_reward"])
    r_step = minform_rewards(p, i["step_mask"], cfg["temperature"], uniform=cfg["disable_weighted_reward"])
    assert_close(r_tok[:, 1::2], r_step)
    assert (r_tok[:, 0::2] == 0).all()


# ---------------------------------------------------------------- step splitting


def _ends(texts):
    end, idx = split_steps([texts])
    return end[0].nonzero().squeeze(-1).tolist(), idx[0].tolist()


def test_split_characters():
    # "1+1=2\n\n2+2=4" as 12 characters: "1+1=2" (0-4), "\n" (5), "\n" (6) -> the step text first ends
    # with "\n\n" at index 6; "2+2=4" (7-11) ends at the final token 11.
    ends, idx = _ends(list("1+1=2\n\n2+2=4"))
    assert ends == [6, 11]
    assert idx == [0] * 7 + [1] * 5


def test_split_bpe_like_tokens():
    # ".\n\n" ends step 0 at its own token (index 2); "=4" is the final token.
    assert _ends(["1", "+1=2", ".\n\n", "2+2", "=4"])[0] == [2, 4]
    # "\n" then "\n\n": the step text "a\n" does not end with "\n\n", "a\n\n\n" does -> index 2.
    assert _ends(["a", "\n", "\n\n", "b"])[0] == [2, 3]
    # "x\n\n\n\ny" as characters: ends at 2 ("x\n\n"), 4 ("\n\n"), 5 (final "y").
    assert _ends(list("x\n\n\n\ny"))[0] == [2, 4, 5]
    # a leading separator is a step of its own
    assert _ends(["\n\n", "a"])[0] == [0, 1]
    # "\n\nThe" does not end with "\n\n": one step
    assert _ends(["a", "\n\nThe", "b"])[0] == [2]


def test_split_final_separator_is_one_step_and_padding():
    end, idx = split_steps([["a", "\n\n"], [], list("ab")], width=4)
    assert end.tolist() == [[False, True, False, False], [False] * 4, [False, True, False, False]]
    assert idx.tolist() == [[0, 0, -1, -1], [-1] * 4, [0, 0, -1, -1]]
    assert step_spans(["a", "\n\n"]) == [(0, 2)]
    with pytest.raises(ValueError, match="width"):
        split_steps([list("abc")], width=2)


# ---------------------------------------------------------------- min-form and credit


def test_minform_golden_and_edges():
    # p = (0.5, −1), T = 1: w = softmax(−0.5, 1) = (e^−0.5, e^1)/(e^−0.5 + e^1); r = w·p.
    p = torch.tensor([[0.5, -1.0], [0.3, 0.0]])
    mask = torch.tensor([[True, True], [False, False]])  # row 1 has no steps -> zeros, no NaN
    z = math.exp(-0.5) + math.exp(1.0)
    want = torch.tensor([[0.5 * math.exp(-0.5) / z, -math.exp(1.0) / z], [0.0, 0.0]])
    assert_close(minform_rewards(p, mask, 1.0), want)
    # uniform: 1/K each
    assert_close(minform_rewards(p, mask, 1.0, uniform=True), torch.tensor([[0.25, -0.5], [0.0, 0.0]]))
    assert minform_weights(p, mask, 1.0)[1].abs().sum() == 0
    with pytest.raises(ValueError, match="temperature"):
        minform_weights(p, mask, 0.0)
    # logits -> p: softmax([0, ln 3]) = (.25, .75) -> p = .5
    assert_close(scores_from_logits(torch.tensor([0.0, math.log(3.0)])), torch.tensor(0.5))


def _brute_strict(p, ends, mask):
    b, t = p.shape
    out = torch.zeros(b, t)
    for i in range(b):
        for s in range(t):
            later = [p[i, k].item() for k in range(s, t) if ends[i, k] and mask[i, k]]
            out[i, s] = min(later) if later and mask[i, s] else 0.0
    return out


@pytest.mark.parametrize("seed", range(5))
def test_strict_equals_brute_force_suffix_minimum(seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None])
    ends = (torch.rand(b, t, generator=g) < 0.3) & mask
    ends[torch.arange(b)[lengths > 0], (lengths - 1)[lengths > 0]] = True
    p = (torch.rand(b, t, generator=g) * 2 - 1) * ends
    assert_close(strict_min_returns(p, ends, mask.float()), _brute_strict(p, ends, mask))
    _, r = process_returns(p, ends, mask.float(), "strict")
    assert_close(r, _brute_strict(p, ends, mask))


def test_credit_minform_uniform_gamma_golden():
    # One row, 4 tokens, steps end at 1 and 3 with p = (0.5, −1).
    p = torch.tensor([[0.0, 0.5, 0.0, -1.0]])
    ends = torch.tensor([[False, True, False, True]])
    mask = torch.ones(1, 4)
    # uniform: r = (0.25, −0.5) at the ends -> suffix sums [−0.25, −0.25, −0.5, −0.5]
    _, r = process_returns(p, ends, mask, "uniform")
    assert_close(r, torch.tensor([[-0.25, -0.25, -0.5, -0.5]]))
    # gamma 0.5 (token-level): R_3 = −1, R_2 = −0.5, R_1 = 0.5 − 0.25 = 0.25, R_0 = 0.125
    _, r = process_returns(p, ends, mask, "gamma", gamma=0.5)
    assert_close(r, torch.tensor([[0.125, 0.25, -0.5, -1.0]]))
    # strict: min over later step ends: [−1, −1, −1, −1]
    _, r = process_returns(p, ends, mask, "strict")
    assert_close(r, torch.tensor([[-1.0, -1.0, -1.0, -1.0]]))


# ---------------------------------------------------------------- baselines and fusion

# Golden group of 2 (credit "gamma" with γ = 1 so r_k = p_k and returns are plain sums):
#   row 0: 4 tokens, steps end at t = 1 (p = 0.5) and t = 3 (p = −1); O_0 = −0.5, len 4, K 2, v = 0
#   row 1: 3 tokens (+1 pad), one step ending at t = 2 (p = 1);       O_1 = 1,    len 3, K 1, v = 1
_P = torch.tensor([[0.0, 0.5, 0.0, -1.0], [0.0, 0.0, 1.0, 0.0]])
_E = torch.tensor([[False, True, False, True], [False, False, True, False]])
_M = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
_V, _G = torch.tensor([0.0, 1.0]), torch.tensor([0, 0])


def test_golden_token_baseline():
    # b_0 = O_1/len_1 = 1/3; b_1 = O_0/len_0 = −0.125.
    # row 0: ntok = (1, 1) -> Σ_{k: e_k ≥ t} ntok = [2, 2, 1, 1] -> baseline [2/3, 2/3, 1/3, 1/3]
    # row 1: ntok = (2)    -> [2, 2, 2, 0]                       -> baseline [−0.25, −0.25, −0.25, 0]
    _, ret = process_returns(_P, _E, _M, "gamma")
    base, b = process_baseline(ret, _E, _M, _G, "token")
    assert_close(b, torch.tensor([1 / 3, -0.125]))
    assert_close(base, torch.tensor([[2 / 3, 2 / 3, 1 / 3, 1 / 3], [-0.25, -0.25, -0.25, 0.0]]))
    # R row 0 = [−0.5, −0.5, −1, −1], row 1 = [1, 1, 1, 0]; RLOO(v) = (−1, +1).
    # A row 0 = [−7/6 − 1, (separator -> 0), −4/3 − 1, −4/3 − 1]; row 1 = 1.25 + 1 = 2.25.
    adv, _ = pure_advantage(_P, _E, _M, _V, _G, credit="gamma")
    assert_close(adv, torch.tensor([[-13 / 6, 0.0, -7 / 3, -7 / 3], [2.25, 2.25, 2.25, 0.0]]))
    adv, _ = pure_advantage(_P, _E, _M, _V, _G, credit="gamma", zero_final=True, zero_separators=False)
    assert_close(adv, torch.tensor([[-13 / 6, -13 / 6, -7 / 3, 0.0], [2.25, 2.25, 0.0, 0.0]]))


def test_golden_step_baseline():
    # b_0 = O_1/K_1 = 1; b_1 = O_0/K_0 = −0.25. Baseline = b_i·#(step ends ≥ t):
    # row 0 [2, 2, 1, 1], row 1 [−0.25, −0.25, −0.25, 0].
    # A row 0 = R − base − 1 = [−3.5, 0 (sep), −3, −3]; row 1 = 1.25 + 1 = 2.25.
    adv, info = pure_advantage(_P, _E, _M, _V, _G, credit="gamma", baseline="step")
    assert_close(info["b"], torch.tensor([1.0, -0.25]))
    assert_close(adv, torch.tensor([[-3.5, 0.0, -3.0, -3.0], [2.25, 2.25, 2.25, 0.0]]))


def test_coefficients_whiten_and_kl():
    # c_pr = 2, c_vr = 0: row 1 -> 2·1.25 = 2.5. KL term: kl = 0.1 per token, coef 1 -> −0.1·(tokens ≥ t).
    kl = 0.1 * _M
    adv, _ = pure_advantage(_P, _E, _M, _V, _G, credit="gamma", c_pr=2.0, c_vr=0.0, kl=kl, kl_coef=1.0)
    assert_close(adv[1], torch.tensor([2.5 - 0.3, 2.5 - 0.2, 2.5 - 0.1, 0.0]))
    # whitening over the 6 kept tokens (the separator is excluded and stays 0)
    adv, _ = pure_advantage(_P, _E, _M, _V, _G, credit="gamma", do_whiten=True)
    keep = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    vals = torch.tensor([-13 / 6, -7 / 3, -7 / 3, 2.25, 2.25, 2.25])
    want = (torch.tensor([[-13 / 6, 0, -7 / 3, -7 / 3], [2.25, 2.25, 2.25, 0]]) - vals.mean()) / vals.std()
    assert_close(adv, want * keep)


def test_singleton_empty_and_no_step_rows():
    # row 0 singleton: baseline 0, RLOO keeps v; row 1/2 group where row 2 is empty (no steps).
    p = torch.tensor([[0.0, -0.5], [0.8, 0.0], [0.0, 0.0]])
    e = torch.tensor([[False, True], [True, False], [False, False]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    for baseline in ("token", "step"):
        adv, info = pure_advantage(p, e, m, torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 1, 1]),
                                   credit="minform", baseline=baseline)
        assert torch.isfinite(adv).all()
        # row 0: R = [−0.5, −0.5] + v 1 = 0.5; row 1: R = 0.8, others empty -> b = 0, RLOO 1 − 0 = 1.
        assert_close(adv, torch.tensor([[0.5, 0.5], [1.8, 0.0], [0.0, 0.0]]))
    met = step_score_metrics(p, e, m)
    assert_close(met["pure/min_step_score"], torch.tensor(0.15))  # mean(−0.5, 0.8), empty row skipped
    assert_close(met["pure/num_steps"], torch.tensor(1.0))


def test_check_step_ends():
    m = torch.tensor([[1.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match="final response token"):
        check_step_ends(torch.tensor([[True, False, False]]), m)
    with pytest.raises(ValueError, match="outside"):
        check_step_ends(torch.tensor([[False, True, True]]), m)
    check_step_ends(torch.tensor([[False, True, False]]), m)
    with pytest.raises(ValueError, match="credit"):
        process_returns(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool), m, "max")
    with pytest.raises(ValueError, match="baseline"):
        process_baseline(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool), m, torch.zeros(1, dtype=torch.int64),
                         "seq")


# ---------------------------------------------------------------- spec end to end


def _cfg(**pure):
    return make_cfg("pure", **pure)


_TEXTS = ["1+1=2\n\n2+2=4", "3+3=6\n\n", "x", "a\n\nb\n\nc", "9\n\n9", "12+1=13", "", "5\n\n\n\n6"]


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = [list(s) for s in _TEXTS]
    ends, _ = split_steps(rows)
    b, t = ends.shape
    mask = torch.tensor([[1.0 if j < len(r) else 0.0 for j in range(t)] for r in rows])
    scores = (torch.rand(b, t, generator=g) * 2 - 1) * ends
    old = -torch.rand(b, t, generator=g) * mask
    return StepBatch(
        response_mask=mask, prefix_mask=torch.zeros(b, t, dtype=torch.bool),
        group_index=torch.arange(b) // 4, rewards=torch.tensor([1.0, 0, 1, 0, 0, 0, 1, 1]),
        old_logprobs=old, behav_logprobs=old + 0.05 * torch.randn(b, t, generator=g) * mask,
        ref_logprobs=old - 0.1 * mask, extras={"step_end_mask": ends, "step_scores": scores})


@pytest.mark.parametrize("opts", [{}, {"credit": "strict", "baseline": "step", "whiten": True},
                                  {"baseline": "verl", "whiten": "batch", "zero_separators": False},
                                  {"whiten": "pure_main", "zero_final": True, "kl_coef": 0.001,
                                   "kl_estimator": "k3"},
                                  {"credit": "gamma", "gamma": 0.9, "zero_final": True},
                                  {"credit": "uniform", "kl_coef": 0.01}])
def test_spec_end_to_end(opts):
    cfg = _cfg(**opts)
    spec = algos.get("pure")
    want = {"process_rewards"} | ({"ref_logprobs", "old_logprobs"} if cfg.pure.kl_coef > 0 else set())
    assert spec.requires(cfg) == want
    batch = _batch()
    adv, metrics = spec.advantage(batch, cfg)
    assert torch.isfinite(adv).all() and adv.abs().sum() > 0
    assert (adv[batch.response_mask == 0] == 0).all()
    # the separator of "1+1=2\n\n" (char 6) is zeroed unless zero_separators is off
    assert (adv[0, 6] == 0) == cfg.pure.zero_separators
    assert torch.isfinite(metrics["pure/min_step_score"])
    logprobs = backprop_all_losses(spec, cfg, batch, adv)
    assert torch.isfinite(logprobs.grad).all() and logprobs.grad.abs().sum() > 0


def test_spec_kl_in_reward_shifts_advantage_by_kl_return():
    # old − ref = 0.1 on every token; with kl_coef 0.5 the advantage drops by 0.05·(tokens ≥ t)
    # on kept tokens (no whitening).
    batch, spec = _batch(), algos.get("pure")
    a0, _ = spec.advantage(batch, _cfg())
    a1, m = spec.advantage(batch, _cfg(kl_coef=0.5))
    keep = (a0 != 0).float()
    n_after = batch.response_mask.flip(-1).cumsum(-1).flip(-1)
    assert_close((a1 - a0) * keep, -0.05 * n_after * keep)
    assert_close(m["pure/kl_ref"], torch.tensor(0.1))
    # KL-in-reward reads π_prox before the update (the learner then computes it even at one optimiser step)
    assert pure_requirements(_cfg(kl_coef=0.5)) == {"process_rewards", "ref_logprobs", "old_logprobs"}
    batch.ref_logprobs = None
    with pytest.raises(ValueError, match="reference"):
        spec.advantage(batch, _cfg(kl_coef=0.5))


# ---------------------------------------------------------------- PURE-verl baseline (§3.5, §7.9)


def test_golden_verl_baseline_with_explicit_width():
    # Golden group of 2 above, credit gamma (γ = 1), v = (0, 1), c_pr = c_vr = 1, nothing zeroed:
    #   fused G row 0 = R0 + 0 = [−0.5, −0.5, −1, −1]  (Σ = −3)
    #   fused G row 1 = R1 + 1 = [2, 2, 2, 0]          (Σ = 6, padding 0)
    # L = 5:  b_0 = 6 / ((2−1)·5) = 1.2,  b_1 = −3 / 5 = −0.6
    #   A row 0 = G − 1.2 = [−1.7, −1.7, −2.2, −2.2];  A row 1 = G + 0.6 = [2.6, 2.6, 2.6, 0]
    opts = dict(credit="gamma", baseline="verl", zero_separators=False)
    adv, info = pure_advantage(_P, _E, _M, _V, _G, width=5, **opts)
    assert_close(info["b"], torch.tensor([1.2, -0.6]))
    assert_close(adv, torch.tensor([[-1.7, -1.7, -2.2, -2.2], [2.6, 2.6, 2.6, 0.0]]))
    # L defaults to the padded width T = 4: b = (6/4, −3/4) = (1.5, −0.75)
    adv4, _ = pure_advantage(_P, _E, _M, _V, _G, **opts)
    assert_close(adv4, torch.tensor([[-2.0, -2.0, -2.5, -2.5], [2.75, 2.75, 2.75, 0.0]]))
    # The reference-shaped function on token rewards (VR 1 at row 1's last token t = 2, plus its step
    # reward 1 there) gives the same numbers.
    r = torch.tensor([[0.0, 0.5, 0.0, -1.0], [0.0, 0.0, 2.0, 0.0]])
    ref_adv, ref_ret = verl_rloo_advantage(r, _M, _G, width=5)
    assert_close(ref_adv, adv)
    assert_close(ref_ret, adv)
    # adv_norm: whiten over the 7 response tokens, then ·M
    w_adv, _ = verl_rloo_advantage(r, _M, _G, width=5, do_whiten=True)
    vals = torch.tensor([-1.7, -1.7, -2.2, -2.2, 2.6, 2.6, 2.6])
    want = (adv - vals.mean()) / vals.std() * _M
    assert_close(w_adv, want)
    assert_close(pure_advantage(_P, _E, _M, _V, _G, width=5, do_whiten="batch", **opts)[0], want)


def test_verl_baseline_edges():
    # Singleton group (the reference divides by n − 1 = 0): baseline 0.  Group {1, 2}: row 2 sees
    # row 1's Σ R = 4 over L = 4 → 1.0; row 1 sees row 2's 0 → 0.
    returns = torch.tensor([[3.0, 0.0], [2.0, 2.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    assert_close(verl_baseline(returns, mask, torch.tensor([0, 1, 1]), width=4), torch.tensor([0.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="rollout.max_response_tokens"):
        verl_baseline(returns, mask, torch.tensor([0, 1, 1]), width=1)


def test_spec_verl_baseline_uses_max_response_tokens():
    # The spec's L is rollout.max_response_tokens (verl pads to its max_response_length), not the
    # batch's padded width: moving it from 40 to 80 halves the baseline.
    batch = _batch()
    spec = algos.get("pure")
    cfg = _cfg(baseline="verl", zero_separators=False)
    for width in (40, 80):
        cfg.rollout.max_response_tokens = width
        adv, metrics = spec.advantage(batch, cfg)
        want, info = pure_advantage(batch.extras["step_scores"], batch.extras["step_end_mask"], batch.response_mask,
                                    batch.rewards, batch.group_index, baseline="verl", zero_separators=False,
                                    width=width)
        assert_close(adv, want)
        assert_close(metrics["pure/baseline"], info["b"].mean())
    b80 = info["b"]
    cfg.rollout.max_response_tokens = 40
    assert_close(spec.advantage(batch, cfg)[1]["pure/baseline"], 2 * b80.mean())


# ---------------------------------------------------------------- KL-in-reward estimators


def test_golden_kl_in_reward_estimators():
    # d = log π − log π_ref = (0.5, −3, 0.7 on padding)
    #   k1 = (0.5, −3, 0)
    #   k3 = exp(−d) − 1 + d: exp(−0.5) − 0.5 = 0.6065307 − 0.5 = 0.1065307;  exp(3) − 4 = 16.0855369
    #   low_var_kl: the same k3, clamped to [−10, 10] → (0.1065307, 10)
    lp = torch.tensor([[0.5, -3.0, 0.7]])
    ref = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert_close(kl_in_reward(lp, ref, mask, "k1"), torch.tensor([[0.5, -3.0, 0.0]]))
    assert_close(kl_in_reward(lp, ref, mask, "k3"), torch.tensor([[0.1065307, 16.0855369, 0.0]]))
    assert_close(kl_in_reward(lp, ref, mask, "low_var_kl"), torch.tensor([[0.1065307, 10.0, 0.0]]))
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_in_reward(lp, ref, mask, "k2")


def test_spec_k3_kl_in_reward():
    # old − ref = 0.1 everywhere: k3 = exp(−0.1) − 1 + 0.1 = 0.9048374 − 0.9 = 0.0048374 per token;
    # with kl_coef 0.5 the kept advantages drop by 0.5·0.0048374·(tokens ≥ t).
    batch, spec = _batch(), algos.get("pure")
    a0, _ = spec.advantage(batch, _cfg())
    a1, m = spec.advantage(batch, _cfg(kl_coef=0.5, kl_estimator="k3"))
    keep = (a0 != 0).float()
    n_after = batch.response_mask.flip(-1).cumsum(-1).flip(-1)
    assert_close((a1 - a0) * keep, -0.5 * 0.0048374 * n_after * keep)
    assert_close(m["pure/kl_ref"], torch.tensor(0.0048374))


# ---------------------------------------------------------------- PURE-main buffer normalisation


def test_golden_pure_main_normalize():
    # adv row 0 = [2, 0, 4], row 1 = [−3, pad, pad]; the masked exact zero is (0, 1).
    # exclude zeros: N' = 4 − 1 = 3, μ = (2 + 0 + 4 − 3)/3 = 1,
    #   var = ((2−1)² + (0−1)² + (4−1)² + (−3−1)²)/3 = (1 + 1 + 9 + 16)/3 = 9 → ×1/3;
    #   out row 0 = [1/3, 0 (restored), 1], row 1 = [−4/3, 0, 0].
    adv = torch.tensor([[2.0, 0.0, 4.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert_close(pure_main_normalize(adv, mask), torch.tensor([[1 / 3, 0.0, 1.0], [-4 / 3, 0.0, 0.0]]))
    # no exclusion (nomask_separator_adv): N' = 4, μ = 3/4,
    #   var = (1.25² + 0.75² + 3.25² + 3.75²)/4 = (1.5625 + 0.5625 + 10.5625 + 14.0625)/4 = 6.6875
    r = 6.6875 ** -0.5
    assert_close(pure_main_normalize(adv, mask, exclude_zeros=False),
                 torch.tensor([[1.25 * r, -0.75 * r, 3.25 * r], [-3.75 * r, 0.0, 0.0]]))
    # var below 1e-8 → divided by 1e-4: constant advantages (var 0) give 0; all zeros (N' = 0) give 0, not NaN
    assert_close(pure_main_normalize(torch.full((1, 2), 0.7), torch.ones(1, 2)), torch.zeros(1, 2))
    assert_close(pure_main_normalize(torch.zeros(2, 2), torch.ones(2, 2)), torch.zeros(2, 2))


def test_pure_main_whiten_through_fusion():
    # Token-baseline golden advantages (separator (0, 1) zeroed):
    #   [[−13/6, 0, −7/3, −7/3], [2.25, 2.25, 2.25, pad]]: 7 response tokens, one exact zero → N' = 6,
    #   μ = (−13/6 − 14/3 + 6.75)/6 = (−1/12)/6 = −1/72,
    #   var = (Σ over the 6 non-zero (a − μ)² + (0 − μ)²)/6  (the zero stays in the numerator)
    vals = [-13 / 6, -7 / 3, -7 / 3, 2.25, 2.25, 2.25]
    mu = -1 / 72
    var = (sum((a - mu) ** 2 for a in vals) + mu ** 2) / 6
    want = torch.tensor([[-13 / 6, 0.0, -7 / 3, -7 / 3], [2.25, 2.25, 2.25, 0.0]])
    want = torch.where(want != 0, (want - mu) / var ** 0.5, torch.zeros_like(want)) * _M
    adv, _ = pure_advantage(_P, _E, _M, _V, _G, credit="gamma", do_whiten="pure_main")
    assert_close(adv, want)
    with pytest.raises(ValueError, match="pure.whiten"):
        pure_advantage(_P, _E, _M, _V, _G, do_whiten="layer")


def test_whiten_config_accepts_the_old_booleans():
    assert _cfg(whiten=True).pure.whiten == "batch"
    assert _cfg(whiten=False).pure.whiten == "none"
    assert _cfg(whiten="pure_main").pure.whiten == "pure_main"
    with pytest.raises(ValueError):
        _cfg(whiten="layer")
    # the spec passes the mode through: whiten=True (batch) equals do_whiten=True on the same batch
    batch, spec = _batch(), algos.get("pure")
    want, _ = pure_advantage(batch.extras["step_scores"], batch.extras["step_end_mask"], batch.response_mask,
                             batch.rewards, batch.group_index, do_whiten=True)
    assert_close(spec.advantage(batch, _cfg(whiten=True))[0], want)
