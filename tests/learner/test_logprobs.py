"""Chunked log-probs/entropy equal the unchunked definition (values and gradients)."""

import pytest
import torch
from torch import nn

from learner.fsdp import load_causal_lm
from learner.logprobs import TokenScorer, chunked_token_logprobs, reference_token_logprobs


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


def test_scorer_matches_hf_logits_on_padded_batch(tiny_dir):
    lm = load_causal_lm(tiny_dir, torch.float32)
    scorer = TokenScorer(lm, temperature=1.3, chunk_tokens=4)
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
    ref_lp, ref_ent = reference_token_logprobs(logits, targets, temperature=1.3)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)


def test_bad_chunk_size_is_an_error():
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_logprobs(torch.zeros(2, 3), nn.Linear(3, 4), torch.zeros(2, dtype=torch.long), chunk_tokens=0)
