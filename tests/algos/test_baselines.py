"""Group baselines: vectorised implementation vs a plain loop, and the documented edge cases."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algos import baselines
from algos.masked import whiten
from algos.returns import discounted_returns


def loop_baseline(name, scores, gid, on_policy=None, use_std=True, eps=1e-6):
    """Reference: one python loop per group with statistics.stdev-style arithmetic."""
    out = [0.0] * len(scores)
    groups = {}
    for i, g in enumerate(gid):
        groups.setdefault(g, []).append(i)
    for rows in groups.values():
        vals = [scores[i] for i in rows]
        if name == "rloo":
            for i in rows:
                out[i] = scores[i] if len(rows) == 1 else scores[i] - (sum(vals) - scores[i]) / (len(rows) - 1)
            continue
        stat_rows = rows if name == "grpo" else [i for i in rows if on_policy[i]]
        sv = [scores[i] for i in stat_rows]
        if len(sv) <= 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(sv) / len(sv)
            std = math.sqrt(sum((v - mean) ** 2 for v in sv) / (len(sv) - 1))
            if name == "grpo_split" and std == 0:
                std = 1.0
        for i in rows:
            out[i] = (scores[i] - mean) / (std + eps) if use_std else scores[i] - mean
    return out


@pytest.mark.parametrize("name", ["grpo", "rloo", "grpo_split"])
@pytest.mark.parametrize("use_std", [True, False])
@pytest.mark.parametrize("rows,groups", [(8, 3), (64, 64), (512, 64), (512, 512), (511, 7)])
def test_vectorised_matches_loop(name, use_std, rows, groups):
    gen = torch.Generator().manual_seed(rows * 1000 + groups)
    scores = torch.randn(rows, generator=gen, dtype=torch.float64)
    scores[::5] = torch.round(scores[::5])  # ties -> some zero-std groups
    gid = torch.randint(0, groups, (rows,), generator=gen)
    on = torch.rand(rows, generator=gen) > 0.3
    # every group keeps at least one on-policy row so grpo_split is defined
    for g in gid.unique():
        on[(gid == g).nonzero()[0]] = True
    kw = {} if name == "rloo" else {"use_std": use_std}
    if name == "grpo_split":
        kw["on_policy"] = on
    got = baselines.compute_baseline(name, scores, gid, **kw)
    want = loop_baseline(name, scores.tolist(), gid.tolist(), on.tolist(), use_std)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-9, rtol=1e-9)


def test_golden_grpo_rloo():
    # Group a = [1, 0, 0, 1]: mean 0.5, unbiased std sqrt((4 × 0.25)/3) = 0.57735
    #   grpo: ±0.5/0.57735 = ±0.866025;  rloo row 0: 1 − (0+0+1)/3 = 0.666667, row 1: 0 − 2/3.
    # Group b = [1] (singleton): grpo uses mean 0, std 1 -> 1/(1+1e-6); rloo leaves it at 1.
    s = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1])
    torch.testing.assert_close(baselines.grpo(s, g), torch.tensor([0.866025, -0.866025, -0.866025, 0.866025, 1.0]),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(baselines.rloo(s, g), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.0]))
    torch.testing.assert_close(baselines.compute_baseline("dr_grpo", s, g), torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0]))


def test_grpo_split_without_on_policy_row_is_a_clear_error():
    s, g = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1])
    on = torch.tensor([True, True, False])
    with pytest.raises(ValueError, match=r"group\(s\) \[1\] have no on-policy row"):
        baselines.grpo_split(s, g, on)


def test_unknown_baseline_names_choices():
    with pytest.raises(ValueError, match="choose one of"):
        baselines.compute_baseline("gae", torch.zeros(2), torch.zeros(2, dtype=torch.long))


def test_empty_batch_is_empty_not_nan():
    assert baselines.grpo(torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=12), st.floats(0.5, 1.0))
def test_discounted_returns_match_definition(rewards, gamma):
    # R_t = Σ_{k≥t} γ^{k−t} r_k
    r = torch.tensor([rewards], dtype=torch.float64)
    got = discounted_returns(r, torch.ones_like(r), gamma)[0].tolist()
    want = [sum(gamma ** (k - t) * rewards[k] for k in range(t, len(rewards))) for t in range(len(rewards))]
    assert got == pytest.approx(want, abs=1e-9)


def test_whiten_golden_and_errors():
    # x = [1, 2, 3] masked, pad 10: mean 2, var (1+0+1)/2 = 1 -> [−1, 0, 1] (pad transformed, not zeroed)
    x = torch.tensor([[1.0, 2.0, 3.0, 10.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    torch.testing.assert_close(whiten(x, m, eps=0.0), torch.tensor([[-1.0, 0.0, 1.0, 8.0]]))
    with pytest.raises(ValueError, match="at least 2"):
        whiten(x, torch.tensor([[1.0, 0, 0, 0]]))
