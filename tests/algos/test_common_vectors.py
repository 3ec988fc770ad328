"""verl's generic helpers (vectors/common_verl_*.json): outcome baselines, dual-clip PPO, agg, KL."""

import pytest
import torch

from algos import baselines
from algos.aggregation import aggregate
from algos.ppo import kl_penalty, ppo_clip_loss
from algos.returns import place_at_last_token
from tests.vectors import assert_close, cases, group_ids


@pytest.mark.parametrize("case", cases("common_verl_outcome_advantages.json"))
def test_outcome_advantages(case):
    i, cfg = case["inputs"], case["config"]
    mask = i["response_mask"].float()
    scores = (i["token_level_rewards"] * mask).sum(-1)
    gid = group_ids(i["index"])
    if case["name"].startswith("rloo"):
        adv = baselines.rloo(scores, gid)
    else:
        adv = baselines.grpo(scores, gid, use_std=cfg["norm_adv_by_std_in_grpo"], eps=cfg["epsilon"])
    assert_close(adv[:, None] * mask, case["outputs"]["advantages"])


@pytest.mark.parametrize("case", cases("common_verl_policy_loss.json"))
def test_policy_loss_agg_kl(case):
    i, cfg, out = case["inputs"], case["config"], case["outputs"]
    name = case["name"]
    if name.startswith("ppo_"):
        mask = i["response_mask"].float()
        loss, m = ppo_clip_loss(i["log_prob"], i["old_log_prob"], i["advantages"], mask,
                                cfg["cliprange"], cfg["cliprange"], cfg["clip_ratio_c"])
        assert_close(aggregate(loss, mask, cfg["loss_agg_mode"]), out["pg_loss"])
        assert_close(m["clipfrac"], out["pg_clipfrac"])
        assert_close(m["ppo_kl"], out["ppo_kl"])
        assert_close(m["clipfrac_lower"], out["pg_clipfrac_lower"])
    elif name.startswith("agg_"):
        assert_close(aggregate(i["loss_mat"], i["loss_mask"].float(), cfg["loss_agg_mode"]), out["loss"])
    else:
        assert_close(kl_penalty(i["logprob"], i["ref_logprob"], cfg["kl_penalty"]), out["kl"])


def test_outcome_reward_at_last_token_roundtrip():
    # Rewards placed at the last valid token sum back to the scalar: row 0 has 3 tokens -> index 2;
    # row 1 is empty and stays all-zero.
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.float32)
    placed = place_at_last_token(torch.tensor([0.7, 1.0]), mask)
    torch.testing.assert_close(placed, torch.tensor([[0.0, 0.0, 0.7, 0.0], [0.0, 0.0, 0.0, 0.0]]))
