"""Chunked log-probs/entropy equal the unchunked definition (values and gradients), with and without
vLLM's top-k/top-p truncation; hand-computed goldens of the truncated distribution."""

import pytest
import torch
from torch import nn

from learner.fsdp import load_causal_lm
from learner.logprobs import (
    OUTSIDE_SUPPORT_LOGPROB,
    TokenScorer,
    chunked_token_logprobs,
    support_mask,
)
from tests.reference.logprobs import reference_token_logprobs


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_equals_unchunked_with_gradients(chunk):
    torch.manual_seed(0)
    hidden = torch.randn(23, 16, dtype=torch.float64, requires_grad=True)
    head = nn.Linear(16, 11, bias=True).double()
    targets = torch.randint(0, 11, (23,))
    lp, ent = chunked_token_logprobs(hidden, head, targets, temperature=0.7, chunk_tokens=chunk,
                                     with_entropy=True)
    (lp * torch.arange(23) + ent).sum().backward()
    got = (hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
    hidden.grad = head.weight.grad = head.bias.grad = None

    ref_lp, ref_ent = reference_token_logprobs(head(hidden), targets, temperature=0.7)
    (ref_lp * torch.arange(23) + ref_ent).sum().backward()
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-6, rtol=0)
    for a, b in zip(got, (hidden.grad, head.weight.grad, head.bias.grad)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_golden_uniform_logits():
    # Zero weights → uniform over V = 4: log p = −ln 4 = −1.386294, entropy = ln 4.
    head = nn.Linear(3, 4, bias=False)
    nn.init.zeros_(head.weight)
    lp, ent = chunked_token_logprobs(torch.randn(5, 3), head, torch.tensor([0, 1, 2, 3, 0]), chunk_tokens=2,
                                     with_entropy=True)
    torch.testing.assert_close(lp, torch.full((5,), -1.3862944))
    torch.testing.assert_close(ent, torch.full((5,), 1.3862944))


@pytest.mark.parametrize("top_p,top_k", [(1.0, 0), (0.8, 30)])
def test_scorer_matches_hf_logits_on_padded_batch(tiny_dir, top_p, top_k):
    lm = load_causal_lm(tiny_dir, torch.float32)
    scorer = TokenScorer(lm, temperature=1.3, top_p=top_p, top_k=top_k, chunk_tokens=4)
    torch.manual_seed(1)
    ids = torch.randint(7, 100, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # row 1 is padded after 6 tokens
    # targets: row 0 tokens 3..8 (predicted from positions 2..7), row 1 tokens 4..5 (positions 3..4)
    positions = torch.tensor([2, 3, 4, 5, 6, 7, 9 + 3, 9 + 4])
    targets = torch.cat([ids[0, 3:9], ids[1, 4:6]])
    with torch.no_grad():
        lp, ent = scorer(ids, mask, positions, targets, with_entropy=True)
        logits = lm(input_ids=ids, attention_mask=mask).logits.reshape(-1, lm.config.vocab_size)[positions]
    ref_lp, ref_ent = reference_token_logprobs(logits, targets, temperature=1.3, top_p=top_p, top_k=top_k)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)


def test_bad_chunk_size_is_an_error():
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_logprobs(torch.zeros(2, 3), nn.Linear(3, 4), torch.zeros(2, dtype=torch.long), chunk_tokens=0)


TRUNCATIONS = [(0.7, 0), (1.0, 4), (0.8, 5), (0.5, -1), (0.95, 10)]


@pytest.mark.parametrize("top_p,top_k", TRUNCATIONS)
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_truncated_chunked_equals_unchunked_with_gradients(top_p, top_k, chunk):
    torch.manual_seed(1)
    hidden = (2 * torch.randn(31, 16, dtype=torch.float64)).requires_grad_()
    head = nn.Linear(16, 11, bias=True).double()
    targets = torch.randint(0, 11, (31,))
    lp, ent = chunked_token_logprobs(hidden, head, targets, temperature=0.7, top_p=top_p, top_k=top_k,
                                     chunk_tokens=chunk, with_entropy=True)
    (lp * torch.arange(31) + ent).sum().backward()
    got = (hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
    hidden.grad = head.weight.grad = head.bias.grad = None

    ref_lp, ref_ent = reference_token_logprobs(head(hidden), targets, temperature=0.7, top_p=top_p, top_k=top_k)
    (ref_lp * torch.arange(31) + ref_ent).sum().backward()
    outside = ref_lp == OUTSIDE_SUPPORT_LOGPROB
    if top_p < 1 or 0 < top_k < 11:  # both kinds of target occur, so both branches are compared
        assert outside.any() and not outside.all()
    torch.testing.assert_close(lp, ref_lp, atol=1e-9, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-9, rtol=0)
    for a, b in zip(got, (hidden.grad, head.weight.grad, head.bias.grad)):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
        assert torch.isfinite(a).all()


def _four_token_head(temperature: float) -> nn.Linear:
    """hidden [n, 1] of zeros -> logits = bias = T·ln p with p = (0.4, 0.25, 0.2, 0.15), so logits/T = ln p."""
    head = nn.Linear(1, 4, bias=True).double()
    nn.init.zeros_(head.weight)
    with torch.no_grad():
        head.bias.copy_(temperature * torch.tensor([0.4, 0.25, 0.2, 0.15], dtype=torch.float64).log())
    return head


FLOOR = OUTSIDE_SUPPORT_LOGPROB
# p = (0.4, 0.25, 0.2, 0.15) after temperature 2.
# top_p 0.7: mass above each token 0, 0.4, 0.65 (< 0.7: kept), 0.85 (≥ 0.7: dropped); kept mass 0.85:
#   log(0.4/0.85) = -0.753772, log(0.25/0.85) = -1.223775, log(0.2/0.85) = -1.446919, token 3 → floor;
#   entropy = 0.470588·0.753772 + 0.294118·1.223775 + 0.235294·1.446919 = 1.055102.
# top_k 2: tokens 0, 1; kept mass 0.65: log(0.4/0.65) = -0.485508, log(0.25/0.65) = -0.955511;
#   entropy = 0.615385·0.485508 + 0.384615·0.955511 = 0.666278.
# top_k 3 then top_p 0.7: top-p runs on the top-3-renormalised p' = (0.470588, 0.294118, 0.235294):
#   mass above token 2 is 0.764706 ≥ 0.7 → dropped (top_p 0.7 alone kept it): same as top_k 2.
GOLDEN = {
    (0.7, 0): ([-0.753772, -1.223775, -1.446919, FLOOR], 1.055102),
    (1.0, 2): ([-0.485508, -0.955511, FLOOR, FLOOR], 0.666278),
    (0.7, 3): ([-0.485508, -0.955511, FLOOR, FLOOR], 0.666278),
}


@pytest.mark.parametrize("top_p,top_k", list(GOLDEN))
def test_golden_four_token_truncation(top_p, top_k):
    want_lp, want_ent = GOLDEN[(top_p, top_k)]
    lp, ent = chunked_token_logprobs(torch.zeros(4, 1, dtype=torch.float64), _four_token_head(2.0),
                                     torch.arange(4), temperature=2.0, top_p=top_p, top_k=top_k, chunk_tokens=3,
                                     with_entropy=True)
    torch.testing.assert_close(lp, torch.tensor(want_lp, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, torch.full((4,), want_ent, dtype=torch.float64), atol=1e-6, rtol=0)


def test_ties_at_the_boundaries_are_kept():
    # z = (ln 0.4, ln 0.2, ln 0.2, ln 0.2). top_k 2: the 2nd largest value is tied three ways → all 4
    # kept. top_p 0.5: mass above each 0.2-token (strictly larger z) is 0.4 < 0.5 → all kept (vLLM
    # keeps one of the three: the boundary falls inside the tie). Either way: the plain distribution.
    z = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log()
    assert support_mask(z, 1.0, 2).all()
    assert support_mask(z, 0.5, 0).all()
    # top_k 1 keeps only the maximum; top_p 0.4: mass above the 0.2-tokens is 0.4 ≥ 0.4 → dropped
    assert support_mask(z, 1.0, 1).tolist() == [[True, False, False, False]]
    assert support_mask(z, 0.4, 0).tolist() == [[True, False, False, False]]


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_metric_only_entropy_is_detached_and_not_recomputed_in_backward(top_p, monkeypatch):
    """Issue 32: the training forward always computes the entropy (the `entropy` metric); without a loss
    term that needs it (`entropy_grad=False`) it is the same numbers, builds no graph, and the chunks'
    checkpoint recompute stops before it: torch.softmax (the entropy's only call of it) runs once per
    chunk, 3 chunks of 4 tokens → 3, where a differentiable entropy runs it again in backward → 6."""
    torch.manual_seed(0)
    hidden = torch.randn(12, 8, requires_grad=True)
    head, targets = nn.Linear(8, 50), torch.randint(0, 50, (12,))
    calls = []
    softmax = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda *a, **k: calls.append(1) or softmax(*a, **k))
    counts, ents, grads = {}, {}, {}
    for entropy_grad in (True, False):
        calls.clear()
        lp, ent = chunked_token_logprobs(hidden, head, targets, top_p=top_p, chunk_tokens=4, with_entropy=True,
                                         entropy_grad=entropy_grad)
        assert ent.requires_grad == entropy_grad
        lp.sum().backward()
        counts[entropy_grad], ents[entropy_grad] = len(calls), ent.detach()
        grads[entropy_grad], hidden.grad = hidden.grad, None
    assert counts == {True: 6, False: 3}
    torch.testing.assert_close(ents[False], ents[True], atol=0, rtol=0)
    torch.testing.assert_close(grads[False], grads[True], atol=0, rtol=0)  # the log-probs' gradient is untouched


@pytest.mark.parametrize("top_k", [0, -1, 4, 9])
def test_no_truncation_is_the_plain_softmax_without_sorting(top_k, monkeypatch):
    """top_p = 1 with top-k off (0, -1, or k ≥ vocab 4, as vLLM): no mask, no sort, no top-k."""
    z = torch.randn(3, 4)
    assert support_mask(z, 1.0, top_k) is None

    def boom(*args, **kwargs):
        raise AssertionError("sorted on the fast path")

    monkeypatch.setattr(torch.Tensor, "sort", boom)
    monkeypatch.setattr(torch.Tensor, "topk", boom)
    head, hidden, targets = nn.Linear(2, 4), torch.randn(3, 2), torch.tensor([0, 1, 3])
    with torch.no_grad():
        lp, _ = chunked_token_logprobs(hidden, head, targets, top_p=1.0, top_k=top_k)
        monkeypatch.undo()
        torch.testing.assert_close(lp, torch.log_softmax(head(hidden), -1)[torch.arange(3), targets])


@pytest.mark.parametrize("kwargs,key", [({"top_p": 0.0}, "rollout.top_p"), ({"top_p": 1.5}, "rollout.top_p"),
                                        ({"top_k": -2}, "rollout.top_k"), ({"temperature": 0.0}, "rollout.temperature")])
def test_bad_sampling_settings_are_errors(kwargs, key):
    with pytest.raises(ValueError, match=key):
        chunked_token_logprobs(torch.zeros(2, 3), nn.Linear(3, 4), torch.zeros(2, dtype=torch.long), **kwargs)


@pytest.mark.parametrize("algo", ["grpo", "sft"])
def test_learner_scores_under_the_rollout_sampling_distribution(tiny_dir, algo):
    """RL specs score under rollout.temperature/top_p/top_k; SFT-only specs under the plain model."""
    from learner.learner import Learner
    from tests.algos.cfg import make_cfg

    cfg = make_cfg("grpo")
    cfg.algo = algo
    cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k = 0.8, 0.7, 5
    policy = Learner(cfg, 0, 1, tiny_dir).policy
    want = (0.8, 0.7, 5) if algo == "grpo" else (1.0, 1.0, 0)
    assert (policy.temperature, policy.top_p, policy.top_k) == want
