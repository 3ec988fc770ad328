"""pure.vr_fraction: the verifiable reward on a stable share of prompts (the PURE paper's PRM+VR arm, 10 %)."""

import random

import torch

from algos.pure.maths import pure_advantage, vr_prompt

# test_pure's golden group of 2 (credit "gamma", γ = 1: r_k = p_k, returns are plain sums):
#   row 0: 4 tokens, steps end at t = 1 (p = 0.5) and t = 3 (p = −1); v = 0
#   row 1: 3 tokens (+1 pad), one step ending at t = 2 (p = 1); v = 1
_P = torch.tensor([[0.0, 0.5, 0.0, -1.0], [0.0, 0.0, 1.0, 0.0]])
_E = torch.tensor([[False, True, False, True], [False, False, True, False]])
_M = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
_V, _G = torch.tensor([0.0, 1.0]), torch.tensor([0, 0])


def assert_close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_vr_prompt_hash_golden_and_stable():
    # u = first 8 bytes of blake2b("0:1,2,3") / 2^64 = 0.45067…; with seed 1, blake2b("1:1,2,3") -> 0.20213…
    assert vr_prompt([1, 2, 3], 0, 0.46) and not vr_prompt([1, 2, 3], 0, 0.45)
    assert vr_prompt([1, 2, 3], 1, 0.21) and not vr_prompt([1, 2, 3], 1, 0.20)
    assert vr_prompt([1, 2, 3], 0, 1.0) and not vr_prompt([1, 2, 3], 0, 0.0)
    # share of 20 000 random prompts within ±0.01 of the fraction (binomial sd 0.0021), the same on a re-ask
    rng = random.Random(0)
    prompts = [[rng.randrange(50000) for _ in range(8)] for _ in range(20000)]
    picks = [vr_prompt(p, 3, 0.1) for p in prompts]
    assert abs(sum(picks) / len(picks) - 0.1) < 0.01
    assert picks == [vr_prompt(p, 3, 0.1) for p in prompts]


def test_golden_advantage_with_vr_on_one_group_of_two():
    # Groups 0 and 1 are copies of test_pure's golden group (token baseline, credit gamma): with the VR
    # term, A row 0 = [−7/6 − 1, 0 (separator), −4/3 − 1, −4/3 − 1], row 1 = 1.25 + 1 = 2.25. Group 1's
    # prompt is out of the VR set (vr_rows 0): the RLOO term (−1, +1) goes, leaving the process part
    # row 2 = [−7/6, 0, −4/3, −4/3], row 3 = [1.25, 1.25, 1.25, 0].
    p, e, m, v = (torch.cat([x, x]) for x in (_P, _E, _M, _V))
    g = torch.cat([_G, _G + 1])
    adv, _ = pure_advantage(p, e, m, v, g, credit="gamma", vr_rows=torch.tensor([True, True, False, False]))
    assert_close(adv, torch.tensor([[-13 / 6, 0.0, -7 / 3, -7 / 3], [2.25, 2.25, 2.25, 0.0],
                                    [-7 / 6, 0.0, -4 / 3, -4 / 3], [1.25, 1.25, 1.25, 0.0]]))
    # all rows in = no mask (pure.vr_fraction 1, today's behaviour)
    full, _ = pure_advantage(p, e, m, v, g, credit="gamma")
    ones, _ = pure_advantage(p, e, m, v, g, credit="gamma", vr_rows=torch.ones(4, dtype=torch.bool))
    assert torch.equal(full, ones)
    # verl baseline: v_i leaves the fused return of the rows out of the set (their G = process return only)
    verl, _ = pure_advantage(p, e, m, v, g, credit="gamma", baseline="verl", width=4,
                             vr_rows=torch.tensor([True, True, False, False]))
    zero_vr, _ = pure_advantage(p, e, m, torch.zeros(4), g, credit="gamma", baseline="verl", width=4)
    assert_close(verl[2:], zero_vr[2:])
