"""Golden test of multi-turn masking (issue 39 item 4): a two-turn row's loss equals the loss of its policy
tokens alone, for every algorithm that trains on multi-turn rows, and environment tokens get no gradient.

The rows, built by hand (prompt [1, 2]):
  two-turn  tokens [10 11 | 50 51 52 | 12 13]   env_mask [0 0 1 1 1 0 0]   versions [4 4 -1 -1 -1 5 5]
  compact   tokens [10 11 12 13]                (the policy's tokens alone, same log-probs and versions)
  other     tokens [20 21 22]                   (the group's second sample, single-turn)
The environment positions get log-probs, π_prox, μ, π_ref and PRIME's q of 9.0 (far from anything a policy
token holds), so any term that read them would move the loss. Both batches share the loss normaliser's
max_len (the compact batch's width, 4): seq-mean-token-sum-norm divides by a constant, not by tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import algos
from algos.aggregation import LossNorm
from algos.batch import LossContext
from algos.pure.steps import turn_spans
from buffer.records import ENV_VERSION, Group, Sample
from learner.batching import global_step_batch, rows_from_groups, staleness_metrics
from tests.algos.cfg import make_cfg

ENV = [False, False, True, True, True, False, False]
POLICY_LP = [-0.5, -1.0, -0.25, -2.0]  # log π_θ of 10 11 12 13 (the compact row)
OTHER_LP = [-0.75, -0.1, -1.5]


def sample(tokens, lp, versions, env=None, reward=1.0) -> Sample:
    n = len(tokens)
    return Sample(tokens=np.asarray(tokens, np.int32), logprobs=np.asarray(lp, np.float32),
                  versions=np.asarray(versions, np.int32), prefix_mask=np.zeros(n, bool), reward=reward,
                  env_mask=None if env is None else np.asarray(env, bool))


def groups(two_turn: bool) -> list[Group]:
    if two_turn:
        lp = POLICY_LP[:2] + [0.0] * 3 + POLICY_LP[2:]
        first = sample([10, 11, 50, 51, 52, 12, 13], lp, [4, 4] + [ENV_VERSION] * 3 + [5, 5], ENV)
    else:
        first = sample([10, 11, 12, 13], POLICY_LP, [4, 4, 5, 5])
    other = sample([20, 21, 22], OTHER_LP, [5, 5, 5], reward=0.0)
    return [Group("g", 0, np.asarray([1, 2], np.int32), [first, other])]


def spread(compact: torch.Tensor, two_turn: bool, fill: float = 9.0) -> torch.Tensor:
    """[2, 4] per-token values of the compact rows -> [2, 7] of the two-turn rows (fill on environment and
    padding positions)."""
    if not two_turn:
        return compact.clone()
    out = torch.full((2, 7), fill)
    out[0, [0, 1, 5, 6]] = compact[0]
    out[1, :3] = compact[1, :3]
    return out


def loss_of(algo: str, two_turn: bool, loss_opts: dict | None = None, section: dict | None = None):
    """(total loss, advantages on policy tokens, grad of log π on every position) of one step on the rows;
    `loss_opts`: loss.* keys, `section`: the algorithm's own."""
    cfg = make_cfg("grpo" if algo == "rloo" else algo, loss_opts, **(section or {}))  # rloo has no options section
    spec = algos.get(algo)
    rows = rows_from_groups(groups(two_turn))
    batch = global_step_batch(rows, torch.device("cpu"), step=0)
    theta = torch.tensor([POLICY_LP, OTHER_LP + [0.0]])
    batch.old_logprobs = spread(theta - 0.05, two_turn) * batch.response_mask
    batch.behav_logprobs = spread(theta - 0.1, two_turn) * batch.response_mask
    batch.ref_logprobs = spread(theta + 0.2, two_turn)
    batch.extras["prime_q"] = spread(torch.tensor([[0.3, -0.2, 0.1, 0.4], [-0.1, 0.2, 0.05, 0.0]]), two_turn)
    # PURE: a step per policy turn; row 0's turns end at compact tokens 1 and 3 (two-turn 1 and 6, turn_spans),
    # row 1's one turn at 2; scores p = 0.4, -0.6 and 0.2 (9.0 off the step ends, which nothing may read)
    ends = spread(torch.tensor([[0.0, 1, 0, 1], [0, 0, 1, 0]]), two_turn, fill=0.0).bool()
    batch.extras["step_end_mask"] = ends
    batch.extras["step_scores"] = torch.where(ends, spread(torch.tensor([[0, 0.4, 0, -0.6], [0, 0, 0.2, 0]]),
                                                           two_turn), torch.tensor(9.0))
    adv = spec.advantage(batch, cfg)[0] if spec.advantage is not None else torch.zeros_like(batch.response_mask)
    logprobs = spread(theta, two_turn).requires_grad_(True)
    ctx = LossContext(logprobs=logprobs, entropy=spread(torch.full((2, 4), 0.7), two_turn) + logprobs * 0,
                      batch=batch, advantages=adv, norm=LossNorm.local(batch.response_mask, max_len=4))
    total = sum(c.weight(cfg) * c.fn(ctx, cfg).loss for c in spec.losses)
    total.backward()
    policy = batch.response_mask.bool()
    return total.detach(), adv[policy], logprobs.grad


@pytest.mark.parametrize("algo,opts,section", [
    ("grpo", None, None), ("grpo", {"kl_coef": 0.1, "entropy_coef": 0.01}, None),
    ("grpo", {"agg": "seq-mean-token-sum-norm"}, None), ("rloo", None, None), ("pacs", None, None),
    ("prime", None, None), ("pure", None, None), ("pure", None, {"credit": "strict"}),
])
def test_two_turn_row_trains_like_its_policy_tokens_alone(algo, opts, section):
    full, adv_full, grad_full = loss_of(algo, True, opts, section)
    alone, adv_alone, grad_alone = loss_of(algo, False, opts, section)
    assert torch.isfinite(full) and float(full) != 0.0
    torch.testing.assert_close(full, alone, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(adv_full, adv_alone, rtol=1e-6, atol=1e-7)
    env = torch.tensor([ENV])
    assert (grad_full[0:1][env] == 0).all(), "an environment token received a gradient"
    torch.testing.assert_close(grad_full[0, [0, 1, 5, 6]], grad_alone[0], rtol=1e-6, atol=1e-8)


def test_a_policy_turn_is_a_pure_step():
    # turns end at tokens 1 and 6 of the two-turn row: the steps are [0, 2) and the observation 2..4 + turn [2, 7)
    assert turn_spans(ENV) == [(0, 2), (2, 7)]
    assert turn_spans([False] * 3) == [(0, 3)]  # single-turn: one step
    assert turn_spans([False, True, True]) == [(0, 1)]  # environment tokens after the last turn: no step
    assert turn_spans([True, False, True, False]) == [(0, 2), (2, 4)]
    assert turn_spans([]) == [] and turn_spans([True]) == []


def test_environment_tokens_leave_the_mask_and_the_staleness():
    rows = rows_from_groups(groups(True))
    batch = global_step_batch(rows, torch.device("cpu"), step=0)
    # row 0: 7 tokens, environment at 2..4 -> mask 1 1 0 0 0 1 1; row 1: 3 tokens, padded to 7
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0, 0]]
    # versions 4 (turn 1) and 5 (turn 2); the environment's -1 is no version: at learner version 6 the
    # oldest policy token lags 6 - 4 = 2 (row 0) and 6 - 5 = 1 (row 1)
    assert staleness_metrics(rows, 6) == {"staleness/min": 1.0, "staleness/mean": 1.5, "staleness/max": 2.0,
                                          "staleness/rows": 2.0}

