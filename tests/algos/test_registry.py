"""Every registered algorithm through the learner's algorithm-blind interface, on edge-case batches.

The batch holds a normal group, a singleton group, an empty response and a LUFFY demonstration row.
Inputs a spec `requires` are filled by name from a table (standing in for the learner's providers,
which are tested in tests/learner): nothing here branches on the algorithm's name.
"""

import math

import pytest
import torch

import algos
from algos.aggregation import LossNorm
from algos.batch import LossContext, StepBatch
from configs.loading import resolve

B, T = 7, 6
LENGTHS = [6, 4, 5, 3, 0, 6, 2]  # row 4 is an empty response
GROUPS = [0, 0, 0, 0, 1, 1, 2]  # group 2 is a singleton
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def make_batch(with_demo_row: bool) -> StepBatch:
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).float()
    prefix = torch.zeros(B, T, dtype=torch.bool)
    if with_demo_row:
        prefix[0] = mask[0].bool()  # row 0 is a whole teacher trace
    old = -torch.rand(B, T, generator=g) * 2 * mask
    behav = torch.where(prefix, torch.zeros_like(old), old + 0.05 * torch.randn(B, T, generator=g) * mask)
    return StepBatch(response_mask=mask, prefix_mask=prefix, group_index=torch.tensor(GROUPS),
                     rewards=torch.tensor(REWARDS), old_logprobs=old, behav_logprobs=behav)


def provide(batch: StepBatch, requirement: str) -> None:
    g = torch.Generator().manual_seed(1)
    mask = batch.response_mask
    if requirement == "ref_logprobs":
        batch.ref_logprobs = batch.old_logprobs - 0.1 * mask
    elif requirement == "old_logprobs":  # π_prox: every batch here has it
        assert batch.old_logprobs is not None
    elif requirement == "teacher_logprobs":
        batch.extras["teacher_logprobs"] = batch.old_logprobs - torch.rand(B, T, generator=g) * mask
    elif requirement == "prime_q":
        batch.extras["prime_q"] = torch.randn(B, T, generator=g) * mask
    elif requirement == "process_rewards":
        ends = torch.zeros(B, T, dtype=torch.bool)
        for i, n in enumerate(LENGTHS):
            if n:
                ends[i, n - 1] = True
                ends[i, min(1, n - 1)] = True
        batch.extras["step_end_mask"] = ends
        batch.extras["step_scores"] = (torch.rand(B, T, generator=g) * 2 - 1) * ends
    else:
        raise AssertionError(f"no test provider for {requirement!r}")


@pytest.mark.parametrize("name", algos.names())
def test_every_algorithm_runs_on_edge_cases(name):
    spec = algos.get(name)
    cfg = resolve(name, overrides=["loss.entropy_coef=0.01"])  # configs/<name>.yaml
    batch = make_batch(with_demo_row=name == "luffy")
    for requirement in spec.requires(cfg):
        provide(batch, requirement)
    adv = torch.zeros(B, T)
    if spec.advantage is not None:
        adv, metrics = spec.advantage(batch, cfg)
        assert adv.shape == (B, T) and torch.isfinite(adv).all()
        assert (adv[4] == 0).all(), "an empty response must get no advantage"
        assert all(math.isfinite(float(v)) for v in metrics.values())
    logits = torch.randn(B, T, 5, requires_grad=True)
    logp_all = torch.log_softmax(logits, -1)
    logprobs = logp_all[..., 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    norm = LossNorm.local(batch.response_mask, max_len=T)
    ctx = LossContext(logprobs=logprobs, entropy=entropy, batch=batch, advantages=adv, norm=norm)
    total = sum(c.weight(cfg) * c.fn(ctx, cfg).loss for c in spec.losses if c.weight(cfg) != 0)
    assert torch.isfinite(total)
    total.backward()
    assert logits.grad.abs().sum() > 0
    assert (logits.grad[4] == 0).all(), "an empty response must get no gradient"


def test_registry_rejects_unknown_and_duplicate_names():
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; choose one of"):
        algos.get("ppo")
    with pytest.raises(ValueError, match="already registered"):
        algos.register(algos.get("grpo"))
