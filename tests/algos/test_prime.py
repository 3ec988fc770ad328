"""PRIME: reference vectors (prime_*.json), brute-force baselines, hand-computed goldens, edge cases, spec."""


import pytest
import torch

import algos
from algos.batch import StepBatch
from algos.prime.maths import prime_advantage, rloo_process_rewards
from algos.prime.options import prime_requirements
from algos.prime.prm import (
    dpo_abs_accuracy,
    dpo_accuracy,
    group_members,
    implicit_process_reward,
    normalize_process_reward,
    prm_ce_loss,
    prm_detach_dpo_loss,
    process_reward_scale,
)
from tests.algos.cfg import backprop_all_losses, make_cfg
from tests.reference.prime import accuracy_group_filter, downsample_groups, implicit_q
from tests.vectors import assert_close, cases

# ---------------------------------------------------------------- reference vectors


@pytest.mark.parametrize("case", cases("prime_orig_implicit_reward.json"))
def test_implicit_reward_vectors(case):
    i, out = case["inputs"], case["outputs"]
    width = i["responses_shape"][1]
    mask = i["attention_mask"][:, -width:].float()
    q = implicit_q(i["log_probs"], i["ref_log_probs"], mask)
    assert_close(q, out["q"])
    # PRIME-orig uses q itself (raw_q), at every token or summed at the last one.
    score = implicit_process_reward(q, mask, raw_q=True, granularity=case["config"]["prime_granularity"])
    assert_close(score, out["token_level_score"])


@pytest.mark.parametrize("case", cases("prime_norm.json"))
def test_norm_vectors(case):
    x = case["inputs"]["token_level_scores"]
    got = normalize_process_reward(x, None, case["config"]["prime_norm"])
    assert_close(got, case["outputs"]["normalized"])


@pytest.mark.parametrize("case", cases("prime_orig_ce_loss.json"))
def test_ce_loss_and_dpo_acc_vectors(case):
    i, cfg, out = case["inputs"], case["config"], case["outputs"]
    mask = i["response_mask"].float()
    if "loss" in out:
        assert_close(prm_ce_loss(i["q"], i["acc"], mask, cfg["beta"]), out["loss"])
    else:
        n = cfg["n_samples"]
        gid = torch.arange(i["acc"].shape[0]) // n
        assert_close(dpo_accuracy(i["token_level_scores"], i["acc"], mask, gid), out["dpo_acc"])


@pytest.mark.parametrize("case", cases("prime_orig_filter.json"))
def test_filter_vectors(case):
    i, cfg = case["inputs"], case["config"]
    # Same layout as prime_orig_implicit_reward.json: 3 prompt columns, 8 response columns.
    mask = i["attention_mask"][:, -8:]
    gid = torch.arange(i["acc"].shape[0]) // cfg["n_samples"]
    keep = accuracy_group_filter(
        i["acc"], gid, cfg["accuracy_lower_bound"], cfg["accuracy_upper_bound"],
        filter_accuracy=cfg["filter_accuracy"], response_mask=mask,
        max_response_length=cfg["max_response_length"] if cfg["filter_truncated"] else None)
    assert torch.equal(keep, case["outputs"]["keep_mask"])


# ---------------------------------------------------------------- brute force


def _brute_seed(r, mask, gid, c_gt, c_pr, gamma, v):
    b, t = r.shape
    out = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        others = [j for j in range(b) if gid[j] == gid[i] and j != i]
        means = [sum(r[j, u].item() for u in range(t) if mask[j, u]) / max(1, int(mask[j].sum()))
                 for j in others]
        pbase = sum(means) / len(means) if others else 0.0
        vbase = sum(v[j].item() for j in others) / len(others) if others else 0.0
        for s in range(t):
            if not mask[i, s]:
                continue
            acc = 0.0
            for k in range(s, t):
                if mask[i, k]:
                    acc += gamma ** (k - s) * (r[i, k].item() - pbase)
            out[i, s] = c_gt * (v[i].item() - vbase) + c_pr * acc
    return out


def _random_batch(seed, b=9, t=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    r = torch.randn(b, t, generator=g) * mask
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3, 3])[:b]
    v = torch.randint(0, 2, (b,), generator=g).float()
    return r, mask, gid, v


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_seed_process_baseline_equals_brute_force_loo(seed, gamma):
    r, mask, gid, v = _random_batch(seed)
    _, returns = prime_advantage(r, mask, v, gid, c_gt=2.0, c_pr=3.0, gamma=gamma, do_whiten=False)
    expected = _brute_seed(r.double(), mask, gid, 2.0, 3.0, gamma, v.double())
    assert_close(returns, expected.float())


def test_reference_baseline_matches_its_formula():
    r, mask, gid, v = _random_batch(7)
    got = rloo_process_rewards(r, mask, gid, "reference")
    for i in range(r.shape[0]):
        members = (gid == gid[i]).nonzero().squeeze(-1).tolist()
        n = len(members)
        s = sum((r[j] * mask[j]).sum().item() / max(1.0, mask[j].sum().item()) for j in members)
        for t in range(r.shape[1]):
            want = 0.0 if not mask[i, t] else (r[i, t].item() if n == 1 else (n * r[i, t].item() - s) / (n - 1))
            assert abs(got[i, t].item() - want) < 1e-5


# ---------------------------------------------------------------- hand-computed goldens


def test_golden_two_row_group_seed_vs_reference():
    # Group of 2: row 0 r = [1, 2] (2 tokens), row 1 r = [3] (1 token); v = (1, 0); c = 1, γ = 1.
    # m_0 = 1.5, m_1 = 3.  Outcome RLOO: row 0: 1 − 0 = 1, row 1: 0 − 1 = −1.
    # seed: row 0 x' = [1−3, 2−3] = [−2, −1] -> suffix [−3, −1] -> +1 = [−2, 0];
    #       row 1 x' = [3 − 1.5] = [1.5] -> −1 = [0.5].
    # reference: x' = (2x − 4.5)/1: row 0 [−2.5, −0.5] -> suffix [−3, −0.5] -> +1 = [−2, 0.5];
    #       row 1 [1.5] -> 0.5.
    r = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    gid, v = torch.tensor([0, 0]), torch.tensor([1.0, 0.0])
    kw = dict(c_gt=1.0, c_pr=1.0, do_whiten=False)
    _, seed = prime_advantage(r, mask, v, gid, process_baseline="seed", **kw)
    _, ref = prime_advantage(r, mask, v, gid, process_baseline="reference", **kw)
    assert_close(seed * mask, torch.tensor([[-2.0, 0.0], [0.5, 0.0]]))
    assert_close(ref * mask, torch.tensor([[-2.0, 0.5], [0.5, 0.0]]))


def test_golden_whitened_advantage():
    # returns of the seed example above on the 3 tokens: [−2, 0, 0.5]; mean −0.5,
    # var (Bessel) = (2.25 + 0.25 + 1)/2 = 1.75 -> A = (R + 0.5)/sqrt(1.75).
    r = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv, _ = prime_advantage(r, mask, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), c_gt=1.0, c_pr=1.0)
    s = 1.75 ** 0.5
    assert_close(adv * mask, torch.tensor([[-1.5 / s, 0.5 / s], [1.0 / s, 0.0]]))


def test_golden_implicit_reward_beta_whole_and_norm():
    # q = [[1, −2, 4], [3, pad, pad]]; β = 0.5: token r = [[0.5, −1, 2], [1.5]];
    # whole: row sums 1.5 at index 2 and 1.5 at index 0.
    q = torch.tensor([[1.0, -2.0, 4.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    tok = implicit_process_reward(q, mask, beta=0.5)
    assert_close(tok, torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.0, 0.0]]))
    whole = implicit_process_reward(q, mask, beta=0.5, granularity="whole")
    assert_close(whole, torch.tensor([[0.0, 0.0, 1.5], [1.5, 0.0, 0.0]]))
    # suffix sums of tok: row 0 [1.5, 1, 2], row 1 [1.5] -> max |.| = 2 -> divide by 2 + 1e-6.
    assert_close(normalize_process_reward(tok, mask), tok / (2.0 + 1e-6))
    # two local shards (one row each): row 0 / 2, row 1 / 1.5.
    assert_close(process_reward_scale(tok, mask, "batch_norm_local", 2), torch.tensor([2.0, 1.5]) + 1e-6)


def test_golden_dpo_acc_and_ce():
    # Group 0: acc [1, .5, 0], Q [3, 1, 2]: pairs (0,1) Δacc .5 agree, (0,2) 1 agree, (1,2) .5 disagree
    #          -> 1.5 / 2 = 0.75.  Group 1: acc [1, 1] -> no differing pair -> 0.5.  Mean 0.625.
    scores = torch.tensor([[3.0], [1.0], [2.0], [5.0], [0.0]])
    acc = torch.tensor([1.0, 0.5, 0.0, 1.0, 1.0])
    mask = torch.ones(5, 1)
    assert_close(dpo_accuracy(scores, acc, mask, torch.tensor([0, 0, 0, 1, 1])), torch.tensor(0.625))
    # CE with β = 1 on Q = [0] and acc 1: −log σ(0) = log 2.
    assert_close(prm_ce_loss(torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), 1.0), torch.tensor(0.6931472))


def test_filter_inclusive_bounds_and_noncontiguous_groups():
    # n = 5: mean 0.2 and 0.8 are kept (inclusive); 0 and 1 dropped. Groups interleaved.
    acc = torch.tensor([1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0], dtype=torch.float32)
    gid = torch.arange(20) % 4
    # group 0: rows 0,4,8,12,16 -> acc 1,1,0,1,0 -> 0.6; group 1: 0,1,0,1,0 -> 0.4;
    # group 2: 1,1,0,1,0 -> 0.6; group 3: 1,0,1,0,0 -> 0.4.
    assert accuracy_group_filter(acc, gid).all()
    acc2 = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0, 0], dtype=torch.float32)
    gid2 = torch.tensor([0] * 5 + [1] * 5)
    keep = accuracy_group_filter(acc2, gid2)  # 0.8 kept, 0.0 dropped
    assert keep.tolist() == [True] * 5 + [False] * 5
    acc3 = torch.tensor([1, 0, 0, 0, 0], dtype=torch.float32)
    assert accuracy_group_filter(acc3, torch.zeros(5, dtype=torch.int64)).all()  # 0.2 kept


def _lam_case():
    # q = [[2, −4, 6], [4, pad, pad], [empty]], β = 0.5 -> q' = [[1, −2, 3], [2], []]; acc = (1, 0, 1).
    q = torch.tensor([[2.0, -4.0, 6.0], [4.0, 7.0, 7.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    return q, mask, torch.tensor([1.0, 0.0, 1.0])


def test_golden_lambda_smoothing_without_gt():
    q, mask, acc = _lam_case()
    # λ = 0.5: row 0 r_2 = 3, r_1 = −2 + 0.5·3 = −0.5, r_0 = 1 + 0.5·(−0.5) = 0.75; row 1 r_0 = 2; row 2 empty.
    r = implicit_process_reward(q, mask, beta=0.5, lam=0.5, acc=acc)
    assert_close(r, torch.tensor([[0.75, -0.5, 3.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # use_gt is ignored at λ = 0 (PRIME-verl's λ = 0 branch): r = q' = [[1, −2, 3], [2]].
    r0 = implicit_process_reward(q, mask, beta=0.5, use_gt=True, acc=acc)
    assert_close(r0, torch.tensor([[1.0, -2.0, 3.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # whole at λ = 0.5: the row totals 0.75 − 0.5 + 3 = 3.25 (index 2) and 2 (index 0).
    w = implicit_process_reward(q, mask, beta=0.5, lam=0.5, granularity="whole")
    assert_close(w, torch.tensor([[0.0, 0.0, 3.25], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_golden_lambda_smoothing_with_gt_and_drop_last_token():
    q, mask, acc = _lam_case()
    # use_gt: row 0 q'_2 = acc − (1 − 2) = 2 -> q' = [1, −2, 2]; row 1 q'_0 = 0 − 0 = 0.
    # λ = 0.5: row 0 r_2 = 2, r_1 = −2 + 0.5·2 = −1, r_0 = 1 + 0.5·(−1) = 0.5; row 1 r_0 = 0.
    kw = dict(beta=0.5, lam=0.5, use_gt=True, acc=acc)
    assert_close(implicit_process_reward(q, mask, **kw),
                 torch.tensor([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # PRIME-verl's token copy (drop_last_token): the last valid token gets 0 -> [0.5, −1, 0], [0].
    assert_close(implicit_process_reward(q, mask, drop_last_token=True, **kw),
                 torch.tensor([[0.5, -1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # whole: 0.5 − 1 + 2 = 1.5 at index 2; row 1 total 0.
    assert_close(implicit_process_reward(q, mask, granularity="whole", **kw),
                 torch.tensor([[0.0, 0.0, 1.5], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    # λ = 1 with use_gt: r_0 = Σ q' = acc_0 = 1; row 0 r = [1 − 2 + 2, −2 + 2, 2] = [1, 0, 2].
    one = implicit_process_reward(q, mask, beta=0.5, lam=1.0, use_gt=True, acc=acc)
    assert_close(one[0], torch.tensor([1.0, 0.0, 2.0]))
    # λ = 0 with drop_last_token (PRIME-verl's default path): β q without the last token: [1, −2, 0], [0].
    assert_close(implicit_process_reward(q, mask, beta=0.5, drop_last_token=True),
                 torch.tensor([[1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def _verl_reward_loop(q, lengths, acc, beta, lam, use_gt):
    """REFERENCE_NOTES §2.2 (PRIME-verl, granularity token) restated as plain loops."""
    b, t = q.shape
    qq = [[beta * q[i, k].item() if k < lengths[i] else 0.0 for k in range(t)] for i in range(b)]
    out = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        e = lengths[i] - 1
        if lam > 0 and use_gt and e >= 0:
            qq[i][e] = acc[i].item() - sum(qq[i][:e])
        r = qq[i] if lam == 0 else [sum(lam ** (k - s) * qq[i][k] for k in range(s, t)) for s in range(t)]
        for s in range(max(e, 0)):  # token copy: t < e_i only
            out[i, s] = r[s]
    return out


@pytest.mark.parametrize("lam,use_gt", [(0.0, False), (0.95, False), (0.95, True), (1.0, True)])
def test_drop_last_token_reproduces_verl_token_granularity(lam, use_gt):
    g = torch.Generator().manual_seed(3)
    lengths = [5, 3, 1, 0, 4]
    mask = (torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]).float()
    q = torch.randn(5, 5, generator=g) * 3  # nonzero padding: must be ignored
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    got = implicit_process_reward(q, mask, beta=0.05, lam=lam, use_gt=use_gt, acc=acc, drop_last_token=True)
    assert_close(got, _verl_reward_loop(q, lengths, acc, 0.05, lam, use_gt).float())


def test_group_members_and_downsample_goldens():
    # groups {0: rows 1, 4}, {1: rows 0, 2, 3}: each row sees its group's values in row order.
    members, valid = group_members(torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0]), torch.tensor([1, 0, 1, 1, 0]))
    assert members.tolist() == [[10, 30, 40], [20, 50, 0], [10, 30, 40], [10, 30, 40], [20, 50, 0]]
    assert valid.tolist() == [[True] * 3, [True, True, False], [True] * 3, [True] * 3, [True, True, False]]
    # 8 candidates (oversample 4 × B = 2), groups 1, 3, 4 pass -> the first two passing: [1, 3].
    passing = torch.tensor([False, True, False, True, True, False, False, False])
    assert downsample_groups(passing, 2).tolist() == [1, 3]
    # only group 2 passes -> it comes first, then the failing groups in order fill: [2, 0, 1].
    assert downsample_groups(torch.tensor([False, False, True, False]), 3).tolist() == [2, 0, 1]
    # PRIME-verl pass mask (n = 2, window [0.2, 0.8], truncation at max_response_length − 1 = 3):
    # group 0 acc (1, 0) mean .5, lengths (2, 3) -> 3 ≥ 3 truncated, fails; group 1 (0, 1), lengths (1, 2)
    # passes; group 2 (1, 1) mean 1 fails. B = 1 -> group 1, rows 2, 3.
    acc = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    gid = torch.arange(6) // 2
    mask = (torch.arange(4)[None, :] < torch.tensor([2, 3, 1, 2, 1, 1])[:, None]).float()
    rows = accuracy_group_filter(acc, gid, response_mask=mask, max_response_length=4 - 1)
    group_pass = rows[::2]
    assert group_pass.tolist() == [False, True, False]
    kept = downsample_groups(group_pass, 1)
    assert (kept[:, None] * 2 + torch.arange(2)).flatten().tolist() == [2, 3]


def _dpo_case():
    # One group of 3, β = 0.5, sequence sums Σq = (2, −2, 4) (q_bc = the same sums), acc = (1, 0, 0).
    q = torch.tensor([[1.0, 1.0], [-2.0, 0.0], [3.0, 1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    acc = torch.tensor([1.0, 0.0, 0.0])
    q_bc, valid = group_members(torch.tensor([2.0, -2.0, 4.0]), torch.zeros(3, dtype=torch.int64))
    acc_bc, _ = group_members(acc, torch.zeros(3, dtype=torch.int64))
    return q, mask, acc, q_bc, acc_bc, valid


def test_golden_detach_dpo_losses():
    q, mask, acc, q_bc, acc_bc, valid = _dpo_case()
    # Q = β Σq = (1, −1, 2).
    # row 0: acc > 0, members with lower acc {1, 2}: other = 0.5·(−2 + 4)/2 = 0.5; x = (1 − 0.5)·(+1) = 0.5
    #        ℓ0 = log(1 + e^−0.5) = 0.4740770
    # row 1: acc = 0, members with higher acc {0}: other = 0.5·2 = 1; x = (−1 − 1)·(−1) = 2
    #        ℓ1 = log(1 + e^−2) = 0.1269280
    # row 2: other = 1; x = (2 − 1)·(−1) = −1; ℓ2 = log(1 + e^1) = 1.3132617
    # dpo (mean): (0.4740770 + 0.1269280 + 1.3132617)/3 = 0.6380889
    dpo = prm_detach_dpo_loss(q, acc, mask, q_bc, acc_bc, 0.5, bc_mask=valid)
    assert_close(dpo, torch.tensor(0.6380889))
    # bon_acc, n = 3: frac(acc_bc ≤ acc_i) = (3/3, 2/3, 2/3) -> w = 3·frac² = (3, 4/3, 4/3);
    # weighted sum 3·0.4740770 + 4/3·(0.1269280 + 1.3132617) = 3.3424839
    bon_acc = prm_detach_dpo_loss(q, acc, mask, q_bc, acc_bc, 0.5, "bon_acc", bc_mask=valid)
    assert_close(bon_acc, torch.tensor(3.3424839))
    # bon_rm: β q_bc = (1, −1, 2) ≤ Q_i: row 0 {1, −1} 2/3, row 1 {−1} 1/3, row 2 all 1
    #         -> w = (3·4/9, 3·1/9, 3) = (4/3, 1/3, 3); sum 4/3·0.4740770 + 1/3·0.1269280 + 3·1.3132617 = 4.6141970
    bon_rm = prm_detach_dpo_loss(q, acc, mask, q_bc, acc_bc, 0.5, "bon_rm", bc_mask=valid)
    assert_close(bon_rm, torch.tensor(4.6141970))
    assert_close(prm_detach_dpo_loss(q, acc, mask, q_bc, acc_bc, 0.5, "bon_rm", reduction="mean"),
                 torch.tensor(4.6141970 / 3))
    # gradient of the dpo mean w.r.t. row 1's valid token: dℓ1/dq = −σ(−x)·s·β = σ(−2)·0.5, over 3 rows:
    # 0.1192029·0.5/3 = 0.0198672; padding and q_bc get nothing.
    dpo.backward()
    assert_close(q.grad[1], torch.tensor([0.0198672, 0.0]))


def test_detach_dpo_without_opponents_and_ragged_groups():
    # Group {0, 1} both acc 1: no member with lower acc -> other = 0, ℓ_i = −log σ(Q_i).
    # Q = 0.5·(2, −2) = (1, −1): ℓ = (log(1 + e^−1), log(1 + e^1)) = (0.3132617, 1.3132617).
    # Row 2 is a singleton with acc 0: other = 0, x = (0.5·4)·(−1) = −2 -> log(1 + e^2) = 2.1269280.
    q = torch.tensor([[2.0], [-2.0], [4.0]])
    acc = torch.tensor([1.0, 1.0, 0.0])
    gid = torch.tensor([0, 0, 1])
    q_bc, valid = group_members(q[:, 0], gid)
    acc_bc, _ = group_members(acc, gid)
    per_row = prm_detach_dpo_loss(q, acc, torch.ones(3, 1), q_bc, acc_bc, 0.5, bc_mask=valid, reduction="none")
    assert_close(per_row, torch.tensor([0.3132617, 1.3132617, 2.1269280]))
    # bon_acc weights: n = 2, frac 1 -> 2·1 = 2 for rows 0, 1; the singleton: n = 1 -> 1·1⁰ = 1.
    w = prm_detach_dpo_loss(q, acc, torch.ones(3, 1), q_bc, acc_bc, 0.5, "bon_acc", bc_mask=valid,
                            reduction="none") / per_row
    assert_close(w, torch.tensor([2.0, 2.0, 1.0]))


def test_golden_dpo_abs_accuracy():
    # Σ scores (2, −1, 0, 3) vs sign(2·acc − 1) for acc (1, 1, 0.5, 0) = (1, 1, 0, −1):
    # signs (1, −1, 0, 1) agree on rows 0 and 2 -> 2/4 = 0.5.
    scores = torch.tensor([[1.0, 1.0], [-1.0, 0.0], [0.0, 0.0], [3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    assert_close(dpo_abs_accuracy(scores, torch.tensor([1.0, 1.0, 0.5, 0.0]), mask), torch.tensor(0.5))


# ---------------------------------------------------------------- edge cases


def test_singleton_and_empty_rows_are_finite():
    # Row 0 is a singleton group (baselines 0: returns = c_gt·v + c_pr·suffix(r));
    # rows 1, 2 form a group where row 2 is empty (m = 0, its returns stay 0).
    r = torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    gid, v = torch.tensor([0, 1, 1]), torch.tensor([1.0, 1.0, 0.0])
    adv, ret = prime_advantage(r, mask, v, gid, c_gt=1.0, c_pr=1.0)
    assert torch.isfinite(adv).all()
    # row 1: process 2 − m_2 (0) = 2, outcome 1 − 0 = 1 -> 3.
    assert_close(ret, torch.tensor([[3.0, 2.0], [3.0, 0.0], [0.0, 0.0]]))


def test_errors():
    with pytest.raises(ValueError, match="granularity"):
        implicit_process_reward(torch.zeros(1, 2), torch.ones(1, 2), granularity="step")
    with pytest.raises(ValueError, match="norm"):
        normalize_process_reward(torch.zeros(1, 2), None, "layer_norm")
    with pytest.raises(ValueError, match="process_baseline"):
        rloo_process_rewards(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, dtype=torch.int64), "loo")
    with pytest.raises(ValueError, match="at least 2"):  # whitening one token
        prime_advantage(torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1), torch.zeros(1, dtype=torch.int64))
    assert normalize_process_reward(torch.zeros(2, 3), None).abs().sum() == 0  # all-zero: no NaN
    with pytest.raises(ValueError, match="drop_last_token"):
        implicit_process_reward(torch.zeros(1, 2), torch.ones(1, 2), granularity="whole", drop_last_token=True)
    with pytest.raises(ValueError, match="use_gt"):
        implicit_process_reward(torch.zeros(1, 2), torch.ones(1, 2), lam=0.5, use_gt=True)
    with pytest.raises(ValueError, match="lam"):
        implicit_process_reward(torch.zeros(1, 2), torch.ones(1, 2), lam=1.5)
    with pytest.raises(ValueError, match="bon_mode"):
        prm_detach_dpo_loss(torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), torch.zeros(1, 1),
                            torch.ones(1, 1), bon_mode="bon")
    with pytest.raises(ValueError, match="cannot keep 3 groups out of 2"):
        downsample_groups(torch.tensor([True, False]), 3)


# ---------------------------------------------------------------- spec end to end


def _cfg(**prime):
    return make_cfg("prime", **prime)


def _batch(b=8, t=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 4, 5, 2, 6, 3, 1, 6])[:b]
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    old = -torch.rand(b, t, generator=g) * mask
    return StepBatch(
        response_mask=mask, prefix_mask=torch.zeros(b, t, dtype=torch.bool),
        group_index=torch.arange(b) // 4, rewards=torch.tensor([1.0, 0, 1, 0, 0, 0, 1, 1])[:b],
        old_logprobs=old, behav_logprobs=old + 0.05 * torch.randn(b, t, generator=g) * mask,
        ref_logprobs=old - 0.1 * mask, extras={"prime_q": torch.randn(b, t, generator=g) * mask})


@pytest.mark.parametrize("opts", [{}, {"process_baseline": "reference", "raw_q": True, "norm": "none"},
                                  {"granularity": "whole", "norm": "batch_norm_local", "norm_shards": 2,
                                   "gamma": 0.9, "whiten": False},
                                  {"lam": 0.95, "use_gt": True, "drop_last_token": True},
                                  {"lam": 0.5, "granularity": "whole", "prm_loss": "bon_rm"}])
def test_spec_end_to_end(opts):
    cfg = _cfg(**opts)
    spec = algos.get("prime")
    assert spec.requires(cfg) == {"prime_q"}
    cfg.loss.kl_coef = 0.1
    assert prime_requirements(cfg) == {"prime_q", "ref_logprobs"}
    batch = _batch()
    adv, metrics = spec.advantage(batch, cfg)
    assert adv.shape == batch.response_mask.shape and torch.isfinite(adv).all()
    assert (adv[batch.response_mask == 0] == 0).all()
    assert adv.abs().sum() > 0
    for key in ("prime/dpo_acc", "prime/dpo_abs_acc", "prime/norm_scale", "prime/reward_mean"):
        assert torch.isfinite(metrics[key])
    logprobs = backprop_all_losses(spec, cfg, batch, adv)
    assert torch.isfinite(logprobs.grad).all() and logprobs.grad.abs().sum() > 0


def test_new_config_keys_validate():
    cfg = _cfg(lam=0.95, use_gt=True, drop_last_token=True, prm_loss="bon_acc")
    assert (cfg.prime.lam, cfg.prime.use_gt, cfg.prime.drop_last_token, cfg.prime.prm_loss) == (0.95, True, True,
                                                                                              "bon_acc")
    defaults = _cfg().prime  # reference-off defaults: PRIME-orig token rewards, CE loss
    assert (defaults.lam, defaults.use_gt, defaults.drop_last_token, defaults.prm_loss) == (0.0, False, False, "ce")
    with pytest.raises(ValueError, match="less than or equal to 1"):
        _cfg(lam=1.5)
    with pytest.raises(ValueError, match="prm_loss"):
        _cfg(prm_loss="hinge")


def test_spec_rejects_missing_or_bad_q():
    spec, cfg = algos.get("prime"), _cfg()
    batch = _batch()
    batch.extras = {}
    with pytest.raises(ValueError, match="prime_q"):
        spec.advantage(batch, cfg)
    batch.extras = {"prime_q": torch.zeros(8, 5)}
    with pytest.raises(ValueError, match="shape"):
        spec.advantage(batch, cfg)
