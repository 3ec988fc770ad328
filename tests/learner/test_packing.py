"""Packed micro-batches equal padded ones: log-probs, entropies, gradients, and a whole learner step
(tiny model, float32). Row lengths are mixed: 3 prompts × 4 responses (full, wrong, half, padded with
"\\n\\n"; helpers.make_groups) give model inputs of 27 to 55 tokens."""

import numpy as np
import pytest
import torch

from learner import batching
from learner.fsdp import load_causal_lm
from learner.learner import Learner
from learner.logprobs import TokenScorer
from tests.learner.helpers import full_weights, make_cfg, make_groups

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def rows(tokenizer):
    rows = batching.rows_from_groups(make_groups(tokenizer, 3, 4))
    assert len({r.seq_len for r in rows}) >= 5  # mixed lengths: padding would be needed
    return rows


def _scorer(tiny_dir) -> TokenScorer:
    return TokenScorer(load_causal_lm(tiny_dir, torch.float32), temperature=0.9, top_p=0.95)


def _outputs(scorer: TokenScorer, mb: batching.MicroBatch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(log-probs [b, width], entropies [b, width], {name: gradient}) of a fixed weighted sum of both."""
    scorer.zero_grad()
    logp, ent = scorer(**mb.inputs(), with_entropy=True)
    weights = torch.linspace(-1.0, 1.0, logp.numel())
    ((logp * weights).sum() + 0.1 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in scorer.named_parameters()}
    return mb.scatter(logp).detach(), mb.scatter(ent).detach(), grads


def test_packed_logprobs_and_gradients_equal_padded(tiny_dir, rows):
    scorer = _scorer(tiny_dir)
    order = list(range(len(rows)))[::-1]  # not sorted by length: the scatter must restore the row order
    padded = _outputs(scorer, batching.make_microbatch(rows, order, 0, CPU))
    packed = _outputs(scorer, batching.make_microbatch(rows, order, 0, CPU, packed=True))
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=0)
    for name, g in padded[2].items():  # within 1e-5 of each gradient's largest entry
        assert float((packed[2][name] - g).abs().max()) <= 1e-5 * float(g.abs().max()), name


def test_attention_stays_inside_each_packed_row(tiny_dir, rows):
    """Changing the first packed row's tokens leaves every later row's log-probs unchanged; without the row
    bounds (plain causal attention over the packed sequence) they change: the check can fail."""
    scorer = _scorer(tiny_dir)
    idx = list(range(6))
    mb = batching.make_microbatch(rows, idx, 0, CPU, packed=True)
    first = mb.row_bounds[1]
    other = mb.input_ids.clone()
    other[0, :first] = (other[0, :first] + 1) % scorer.lm.config.vocab_size
    later = mb.row_of > 0
    with torch.no_grad():
        base = scorer(**mb.inputs())[0][later]
        moved = scorer(**(mb.inputs() | {"input_ids": other}))[0][later]
        crossing = scorer(**(mb.inputs() | {"input_ids": other, "row_bounds": (0, other.shape[1])}))[0][later]
    torch.testing.assert_close(moved, base, atol=1e-6, rtol=0)
    assert float((crossing - base).abs().max()) > 1e-3


def test_packed_inputs_need_the_packed_attention(tiny_dir, rows):
    scorer = _scorer(tiny_dir)
    assert scorer.lm.config._attn_implementation == "packed_sdpa"  # switched from the loaded "sdpa"
    scorer.lm.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="learner.packing=false"):
        scorer(**batching.make_microbatch(rows, [0, 1], 0, CPU, packed=True).inputs())


def test_learner_step_packed_equals_padded(tiny_dir, tokenizer):
    """Two GRPO steps (the second from the weights the first moved) padded in 4-row micro-batches, packed in
    4-row micro-batches, and packed under a 1-token budget (every row a micro-batch of its own: 16) with
    activation checkpointing (the recomputed forward must get the row bounds too)."""
    groups = make_groups(tokenizer, 4, 4, version=1)
    arms = [({"packing": False}, 4), ({"packing": True}, 4),
            ({"packing": True, "micro_batch_samples": 16, "micro_batch_tokens": 1, "activation_checkpointing": True}, 16)]
    weights, metrics = [], []
    for overrides, count in arms:
        cfg = make_cfg("grpo", learner={"micro_batch_samples": 4, "batch_prompts": 4} | overrides,
                       loss={"entropy_coef": 0.01})
        learner = Learner(cfg, 0, 1, tiny_dir)
        learner.step(groups, version=1)
        metrics.append(learner.step(groups, version=2))
        assert metrics[-1]["batch/microbatches_per_rank"] == count
        weights.append(full_weights(learner))
    for m, w in zip(metrics[1:], weights[1:]):
        for k in ("loss/total", "loss/pg", "loss/entropy", "optim/grad_norm"):
            assert m[k] == pytest.approx(metrics[0][k], rel=1e-5, abs=1e-8), k
        for k in w:  # Adam steps ≈ lr = 1e-3; 1e-5 = 1% of a step (see test_learner_algos)
            np.testing.assert_allclose(w[k], weights[0][k], atol=1e-5, rtol=0, err_msg=k)
