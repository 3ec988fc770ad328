"""Global normalisation: the gradient of one optimiser step does not depend on how the step is split.

A real gradient: a small torch model produces per-token log-probs; the loss is the PPO-clip policy
loss aggregated with `LossNorm` counted over the whole step. "1 rank × 4 micro-batches" sums four
micro-batch gradients; "2 ranks × 2 micro-batches" sums two per rank and then sums the ranks (an
all-reduce SUM; the learner undoes FSDP's 1/world_size averaging). Both must equal the gradient of the
whole batch in one piece.
"""

import pytest
import torch

from algos.aggregation import AGG_MODES, LossNorm, aggregate, aggregate_rows
from algos.ppo import ppo_clip_loss

B, T, V, H = 16, 12, 11, 8


def make_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[1], lengths[2] = T, 0, 0  # empty rows, all in the first quarter of the batch
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    adv = torch.randn(B, 1, generator=g).expand(B, T) * mask
    old = -torch.rand(B, T, generator=g) * 3
    return tokens, mask, adv, old


def model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(V, H), torch.nn.Tanh(), torch.nn.Linear(H, V)).double()


def grad_of(net, rows_per_part, tokens, mask, adv, old, mode, norm):
    net.zero_grad()
    for rows in rows_per_part:
        logp = torch.log_softmax(net(tokens[rows]), -1).gather(-1, tokens[rows, :, None]).squeeze(-1)
        loss, _ = ppo_clip_loss(logp, old[rows].double(), adv[rows].double(), mask[rows])
        aggregate(loss, mask[rows], mode, norm).backward()
    return torch.cat([p.grad.flatten().clone() for p in net.parameters()])


@pytest.mark.parametrize("mode", AGG_MODES)
def test_microbatch_and_world_size_invariance(mode):
    tokens, mask, adv, old = make_batch()
    net = model()
    idx = torch.arange(B)
    full_norm = LossNorm.local(mask, max_len=T)
    whole = grad_of(net, [idx], tokens, mask, adv, old, mode, full_norm)

    # The learner counts norms per micro-batch and merges them (all-reduce) before any backward.
    parts4 = list(idx.chunk(4))
    norm = LossNorm.local(mask[parts4[0]], max_len=T)
    for p in parts4[1:]:
        norm = norm.merge(LossNorm.local(mask[p], max_len=T))
    assert norm == full_norm
    one_rank_4mb = grad_of(net, parts4, tokens, mask, adv, old, mode, norm)

    rank0, rank1 = idx[: B // 2], idx[B // 2:]
    two_ranks_2mb = (grad_of(net, list(rank0.chunk(2)), tokens, mask, adv, old, mode, norm)
                     + grad_of(net, list(rank1.chunk(2)), tokens, mask, adv, old, mode, norm))
    assert whole.abs().sum() > 0
    torch.testing.assert_close(one_rank_4mb, whole, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(two_ranks_2mb, whole, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_local_per_microbatch_normalisation_would_differ(mode):
    # The property above is not vacuous: normalising each micro-batch by its own counts (the
    # references' behaviour) gives a different gradient when micro-batches hold different token counts.
    tokens, mask, adv, old = make_batch()
    net = model()
    idx = torch.arange(B)
    whole = grad_of(net, [idx], tokens, mask, adv, old, mode, LossNorm.local(mask, max_len=T))
    net.zero_grad()
    for rows in idx.chunk(4):
        logp = torch.log_softmax(net(tokens[rows]), -1).gather(-1, tokens[rows, :, None]).squeeze(-1)
        loss, _ = ppo_clip_loss(logp, old[rows].double(), adv[rows].double(), mask[rows])
        (aggregate(loss, mask[rows], mode) / 4).backward()
    local = torch.cat([p.grad.flatten() for p in net.parameters()])
    assert not torch.allclose(local, whole, atol=1e-8)


def test_golden_aggregation():
    # loss = [[1, 2, 3], [4, 0, 0]], mask = [[1, 1, 0], [1, 0, 0]] (T_pad = 3)
    #   token-mean              (1+2+4)/3 = 2.3333
    #   seq-mean-token-sum      ((1+2) + 4)/2 = 3.5
    #   seq-mean-token-mean     ((1+2)/2 + 4/1)/2 = 2.75
    #   seq-mean-token-sum-norm (1+2+4)/3 = 2.3333
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    want = {"token-mean": 7 / 3, "seq-mean-token-sum": 3.5, "seq-mean-token-mean": 2.75,
            "seq-mean-token-sum-norm": 7 / 3}
    for mode, value in want.items():
        assert float(aggregate(loss, mask, mode)) == pytest.approx(value)
    assert float(aggregate_rows(torch.tensor([1.0, 3.0]))) == 2.0
    with pytest.raises(ValueError, match="unknown loss_agg"):
        aggregate(loss, mask, "sum")


def test_all_masked_batch_gives_zero_not_nan():
    loss = torch.ones(2, 3)
    for mode in AGG_MODES:
        assert float(aggregate(loss, torch.zeros(2, 3), mode)) == 0.0
