"""GSPO (loss.ratio_level = sequence): golden values, gradient form, per-sequence clip, dual clip, IS."""

import math

import pytest
import torch

import algos
from algos.aggregation import LossNorm, aggregate
from algos.batch import LossContext, StepBatch
from algos.luffy import maths as luffy
from algos.policy_gradient import PG
from algos.ppo import ppo_clip_loss, sequence_log_ratio
from tests.algos.cfg import make_cfg
from tests.vectors import assert_close

# Row 0: two tokens, log π_old = (−1, −1), log π_θ = (−0.9, −0.7) → Δ = (0.1, 0.3), mean 0.2,
#        s_0 = e^0.2 = 1.2214028.  Row 1: one token with Δ = 0 and one padded column (Δ = 5 there,
#        which must not count): s_1 = 1.
_OLD = torch.tensor([[-1.0, -1.0], [-2.0, 0.0]])
_LP = torch.tensor([[-0.9, -0.7], [-2.0, 5.0]])
_M = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
S0 = math.exp(0.2)


def test_sequence_ratio_value_and_padding():
    r = torch.exp(sequence_log_ratio(_LP, _OLD, _M))
    assert_close(r, torch.tensor([[S0, S0], [1.0, 1.0]]))


def test_golden_gspo_loss_and_gradient():
    # A = 1 on row 0, ε = 0.3: s_0 = 1.2214 < 1.3, no clip. ℓ_t = −s_0 on both tokens; token-mean over
    # row 0's 2 tokens = −1.2214028; ∂/∂log π_t = −s_0/2 = −0.6107014 on each token (GSPO-token: every
    # token's gradient is scaled by the sequence ratio, not its own ratio).
    lp = _LP[:1].clone().requires_grad_(True)
    adv = torch.ones(1, 2)
    tok, m = ppo_clip_loss(lp, _OLD[:1], adv, _M[:1], 0.3, 0.3, ratio_level="sequence")
    loss = aggregate(tok, _M[:1], "token-mean")
    assert_close(loss, torch.tensor(-S0))
    loss.backward()
    assert_close(lp.grad, torch.tensor([[-S0 / 2, -S0 / 2]]))
    assert m["clipfrac"] == 0
    # Token level on the same data: ratios e^0.1 = 1.1051709 and e^0.3 = 1.3498588 → the second is
    # clipped at 1.3: loss −(1.1051709 + 1.3)/2 = −1.2025855, gradient only on the first token.
    lp2 = _LP[:1].clone().requires_grad_(True)
    tok2, _ = ppo_clip_loss(lp2, _OLD[:1], adv, _M[:1], 0.3, 0.3, ratio_level="token")
    loss2 = aggregate(tok2, _M[:1], "token-mean")
    assert_close(loss2, torch.tensor(-1.2025855))
    loss2.backward()
    assert_close(lp2.grad, torch.tensor([[-math.exp(0.1) / 2, 0.0]]))


@pytest.mark.parametrize("seed", range(3))
def test_gspo_token_gradient_equals_sequence_objective(seed):
    # With one advantage per row and seq-mean-token-mean, GSPO-token's gradient is that of the
    # sequence objective −(1/B) Σ_i A_i·s_i (no clip active: ε huge).
    g = torch.Generator().manual_seed(seed)
    b, t = 4, 6
    lengths = torch.tensor([6, 3, 1, 5])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    old = -torch.rand(b, t, generator=g) * 2
    lp0 = old + 0.2 * torch.randn(b, t, generator=g)
    a_row = torch.randn(b, generator=g)
    lp = lp0.clone().requires_grad_(True)
    tok, _ = ppo_clip_loss(lp, old, a_row[:, None].expand(b, t), mask, 10.0, 10.0, ratio_level="sequence")
    aggregate(tok, mask, "seq-mean-token-mean").backward()
    ref = lp0.clone().requires_grad_(True)
    s = torch.exp(((ref - old) * mask).sum(-1) / mask.sum(-1))
    (-(a_row * s).mean()).backward()
    assert_close(lp.grad, ref.grad * mask)


def test_per_sequence_clip_with_gspo_epsilons():
    # GSPO's ε_low = 3e-4, ε_high = 4e-4. s_0 = 1.2214 > 1.0004:
    #   A = +1: the clipped branch −1.0004 is larger → ℓ = −1.0004 on both tokens, no gradient, clipfrac 1.
    #   A = −1: −A·s = 1.2214 > −A·1.0004 = 1.0004 → unclipped, gradient s_0/2 = 0.6107014 per token.
    for a, want_loss, want_grad, frac in ((1.0, -1.0004, 0.0, 1.0), (-1.0, S0, S0 / 2, 0.0)):
        lp = _LP[:1].clone().requires_grad_(True)
        tok, m = ppo_clip_loss(lp, _OLD[:1], torch.full((1, 2), a), _M[:1], 3e-4, 4e-4, ratio_level="sequence")
        aggregate(tok, _M[:1], "token-mean").backward()
        assert_close(tok, torch.full((1, 2), want_loss))
        assert_close(lp.grad, torch.full((1, 2), want_grad))
        assert_close(m["clipfrac"], torch.tensor(frac))


def test_dual_clip_per_token_on_sequence_ratio():
    # Δ = (2, 2) → s = e² = 7.389; A = (−1, −0.1), c = 3: token 0: min(7.389, 3) = 3 (dual clip active);
    # token 1: min(0.7389, 0.3) = 0.3 — the dual clip acts on each token's own A.
    old = torch.zeros(1, 2)
    lp = torch.full((1, 2), 2.0)
    tok, m = ppo_clip_loss(lp, old, torch.tensor([[-1.0, -0.1]]), torch.ones(1, 2), 0.2, 0.2, dual_clip=3.0,
                           ratio_level="sequence")
    assert_close(tok, torch.tensor([[3.0, 0.3]]))
    assert_close(m["clipfrac_lower"], torch.tensor(1.0))
    with pytest.raises(ValueError, match="ratio_level"):
        ppo_clip_loss(lp, old, old, torch.ones(1, 2), ratio_level="row")


def _batch(behav):
    return StepBatch(response_mask=_M[:1], prefix_mask=torch.zeros(1, 2, dtype=torch.bool),
                     group_index=torch.zeros(1, dtype=torch.int64), rewards=torch.ones(1), old_logprobs=_OLD[:1],
                     behav_logprobs=behav)


def test_clipped_pg_gspo_with_tis_correction():
    # π_prox/μ = (e^0.5, e^1) = (1.6487213, 2.7182818) → tis caps at 2 → w = (1.6487213, 2).
    # ℓ_t = −A·s_0·w_t with A = 1, ε = 0.3 (no clip): token-mean = −1.2214028·(1.6487213 + 2)/2 = −2.2283850
    cfg = make_cfg("grpo", loss={"ratio_level": "sequence", "clip_low": 0.3, "clip_high": 0.3})
    batch = _batch(_OLD[:1] - torch.tensor([[0.5, 1.0]]))
    ctx = LossContext(logprobs=_LP[:1], entropy=None, batch=batch, advantages=torch.ones(1, 2),
                      norm=LossNorm.local(_M[:1]))
    assert_close(PG.fn(ctx, cfg).loss, torch.tensor(-S0 * (math.exp(0.5) + 2.0) / 2))
    cfg.loss.ratio_level = "token"  # the same through token ratios: −(1.1051709·1.6487213 + 1.3·2)/2
    assert_close(PG.fn(ctx, cfg).loss, torch.tensor(-(math.exp(0.1) * math.exp(0.5) + 1.3 * 2.0) / 2))


def test_luffy_rejects_sequence_ratio():
    cfg = make_cfg("luffy", loss={"ratio_level": "sequence"})
    assert any(p.startswith("loss.ratio_level") for p in algos.get("luffy").validate(cfg))
    ctx = LossContext(logprobs=_LP[:1], entropy=None, batch=_batch(_OLD[:1]), advantages=torch.ones(1, 2),
                      norm=LossNorm.local(_M[:1]))
    with pytest.raises(ValueError, match="loss.ratio_level"):
        luffy.MIXED_PG.fn(ctx, cfg)
    with pytest.raises(ValueError):
        make_cfg("grpo", loss={"ratio_level": "row"})
