"""DAPO overlong handling: soft punishment golden values, overlong filtering in every loss term, and the
`truncated` flag from buffer samples to the StepBatch."""

import math

import numpy as np
import pytest
import torch

import algos
from algos.aggregation import LossNorm
from algos.batch import LossContext, StepBatch
from algos.luffy import maths as luffy
from algos.overlong import filter_truncated, loss_mask, overlong_penalty, shaped_rewards
from algos.policy_gradient import ENTROPY, KL, PG
from algos.pure.maths import pure_advantage
from buffer.records import Group, Sample
from learner import batching
from tests.algos.cfg import make_cfg
from tests.vectors import assert_close


def test_golden_soft_overlong_penalty():
    # L_max = 10, L_cache = 4 → the ramp starts after L_max − L_cache = 6 tokens:
    #   |y| = 5, 6 → 0;  7 → (6 − 7)/4 = −0.25;  9 → −0.75;  10 → −1;  12 (> L_max) → −1
    lengths = torch.tensor([5, 6, 7, 9, 10, 12])
    want = torch.tensor([0.0, 0.0, -0.25, -0.75, -1.0, -1.0])
    assert_close(overlong_penalty(lengths, 10, 4), want)
    assert_close(overlong_penalty(lengths, 10, 4, factor=0.5), 0.5 * want)
    assert_close(overlong_penalty(lengths, 10, 0), torch.zeros(6))
    with pytest.raises(ValueError, match="loss.overlong_cache_tokens"):
        overlong_penalty(lengths, 10, 11)


def _batch(lengths, rewards, truncated=None, prefix=None, group=None):
    b, t = len(lengths), max(lengths)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).float()
    old = torch.full((b, t), math.log(0.5)) * mask
    return StepBatch(response_mask=mask,
                     prefix_mask=torch.zeros(b, t, dtype=torch.bool) if prefix is None else prefix,
                     group_index=torch.zeros(b, dtype=torch.int64) if group is None else group,
                     rewards=torch.tensor(rewards), old_logprobs=old, behav_logprobs=old, ref_logprobs=old - 0.1,
                     truncated=None if truncated is None else torch.tensor(truncated))


def _cfg(algo="grpo", **loss):
    cfg = make_cfg(algo, loss={"is_correction": "none", **loss})
    cfg.rollout.max_response_tokens = 4
    return cfg


def test_shaped_rewards_golden():
    # L_max = 4, L_cache = 2 → ramp after 2 tokens: lengths (4, 3, 2) → penalty (−1, −0.5, 0);
    # rewards (1, 1, 0) → (0, 0.5, 0).
    batch = _batch([4, 3, 2], [1.0, 1.0, 0.0], truncated=[True, False, False])
    rewards, metrics = shaped_rewards(batch, _cfg(overlong_cache_tokens=2))
    assert_close(rewards, torch.tensor([0.0, 0.5, 0.0]))
    assert_close(metrics["overlong/penalty_mean"], torch.tensor(-0.5))
    assert_close(metrics["overlong/penalised_frac"], torch.tensor(2 / 3))
    assert_close(metrics["overlong/truncated_frac"], torch.tensor(1 / 3))
    rewards, metrics = shaped_rewards(batch, _cfg())  # cache 0 = off
    assert_close(rewards, batch.rewards)
    assert "overlong/penalty_mean" not in metrics


def test_penalty_reaches_pure_and_luffy_advantages():
    # PURE: a process-free batch (only final step ends, score 0) in one group: the advantage is the RLOO
    # of the shaped rewards (0, 0.5, 0): row 0 → 0 − 0.25 = −0.25, row 1 → 0.5 − 0 = 0.5, row 2 → −0.25.
    batch = _batch([4, 3, 2], [1.0, 1.0, 0.0])
    ends = torch.zeros_like(batch.response_mask, dtype=torch.bool)
    ends[[0, 1, 2], [3, 2, 1]] = True
    batch.extras = {"step_end_mask": ends, "step_scores": torch.zeros_like(batch.response_mask)}
    cfg = _cfg("pure", overlong_cache_tokens=2)
    adv, metrics = algos.get("pure").advantage(batch, cfg)
    assert_close(adv[:, 0], torch.tensor([-0.25, 0.5, -0.25]))
    assert_close(metrics["overlong/penalty_mean"], torch.tensor(-0.5))
    want, _ = pure_advantage(batch.extras["step_scores"], ends, batch.response_mask, torch.tensor([0.0, 0.5, 0.0]),
                             batch.group_index)
    assert_close(adv, want)
    # LUFFY (grpo, no std, no extreme filter): mean of (0, 0.5, 0) is 1/6 → (−1/6, 1/3, −1/6)
    cfg = _cfg("luffy", overlong_cache_tokens=2)
    cfg.luffy.estimator, cfg.luffy.use_std, cfg.luffy.filter_extreme_groups = "grpo", False, False
    adv, _ = algos.get("luffy").advantage(batch, cfg)
    assert_close(adv[:, 0], torch.tensor([-1 / 6, 1 / 3, -1 / 6]))


def test_filter_masks():
    mask = torch.ones(3, 2)
    truncated = torch.tensor([True, False, True])
    assert_close(filter_truncated(mask, truncated), torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]))
    batch = _batch([2, 2, 2], [0.0, 1.0, 0.0], truncated=[True, False, True])
    assert_close(loss_mask(batch, mask, _cfg()), mask)  # filter off: unchanged
    assert_close(loss_mask(batch, mask, _cfg(overlong_filter=True)), filter_truncated(mask, truncated))


def _ctx(batch, lp, adv, norm_mask):
    return LossContext(logprobs=lp, entropy=torch.exp(lp), batch=batch, advantages=adv,
                       norm=LossNorm.local(norm_mask))


def test_overlong_filter_in_pg_entropy_and_kl():
    # Two rows of 2 tokens, row 0 truncated. π_θ = π_prox (ratio 1), A = (3, 1) per row:
    #   filter on, normaliser over the kept row (2 tokens): pg = −(1 + 1)/2 = −1;
    #   entropy term (entropy := p = 0.5 here) = (0.5 + 0.5)/2 = 0.5; KL k1 = 0.1 per token → 0.1.
    #   filter off (4 tokens): pg = −(3·2 + 1·2)/4 = −2.
    batch = _batch([2, 2], [1.0, 0.0], truncated=[True, False])
    adv = torch.tensor([[3.0, 3.0], [1.0, 1.0]])
    cfg = _cfg(overlong_filter=True, kl_coef=0.1)
    kept = loss_mask(batch, batch.response_mask, cfg)
    lp = batch.old_logprobs.clone().requires_grad_(True)
    pg = PG.fn(_ctx(batch, lp, adv, kept), cfg)
    assert_close(pg.loss, torch.tensor(-1.0))
    assert_close(pg.metrics["overlong/filtered_frac"], torch.tensor(0.5))
    pg.loss.backward()
    assert lp.grad[0].abs().sum() == 0 and lp.grad[1].abs().sum() > 0
    assert_close(ENTROPY.fn(_ctx(batch, lp, adv, kept), cfg).loss, torch.tensor(0.5))
    assert_close(KL.fn(_ctx(batch, lp, adv, kept), cfg).loss, torch.tensor(0.1))
    cfg.loss.overlong_filter = False
    assert_close(PG.fn(_ctx(batch, lp, adv, batch.response_mask), cfg).loss, torch.tensor(-2.0))


def test_overlong_filter_in_luffy_loss():
    # Row 0 (truncated) is a demonstration, row 1 on-policy, both p = 0.5 = p_old, A = 1:
    #   kept: only row 1, on-policy ratio 1 → ℓ = −1 per token, token-mean −1; row 0 gets no gradient.
    prefix = torch.tensor([[True, True], [False, False]])
    batch = _batch([2, 2], [1.0, 0.0], truncated=[True, False], prefix=prefix)
    cfg = _cfg("luffy", overlong_filter=True)
    kept = loss_mask(batch, batch.response_mask, cfg)
    lp = batch.old_logprobs.clone().requires_grad_(True)
    term = luffy.MIXED_PG.fn(_ctx(batch, lp, torch.ones(2, 2), kept), cfg)
    assert_close(term.loss, torch.tensor(-1.0))
    term.loss.backward()
    assert lp.grad[0].abs().sum() == 0 and lp.grad[1].abs().sum() > 0


def test_truncated_flag_reaches_the_step_batch():
    def sample(t, truncated):
        return Sample(tokens=np.arange(10, 10 + t, dtype=np.int32), logprobs=np.full(t, -0.5, dtype=np.float32),
                      versions=np.zeros(t, dtype=np.int32), prefix_mask=np.zeros(t, dtype=bool), reward=1.0,
                      finish_reason="length" if truncated else "stop", truncated=truncated)

    group = Group(group_id="g0", prompt_index=0, prompt_tokens=np.arange(1, 4, dtype=np.int32),
                  samples=[sample(3, False), sample(4, True), sample(2, False)])
    rows = batching.rows_from_groups([group])
    assert [r.truncated for r in rows] == [False, True, False]
    batch = batching.global_step_batch(rows, torch.device("cpu"), 0)
    assert batch.truncated.dtype == torch.bool and batch.truncated.tolist() == [False, True, False]
    assert batch.rows(torch.tensor([1, 2])).truncated.tolist() == [True, False]
    # a StepBatch built without the flag has it all False, one per row
    assert _batch([1, 2, 2], [0.0, 0.0, 0.0]).truncated.tolist() == [False] * 3
