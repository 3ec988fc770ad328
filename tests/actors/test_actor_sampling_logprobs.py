"""The learner's log-probs reproduce vLLM's processed log-probs under top-p / top-k truncation.

1. `learner.logprobs.support_mask` keeps exactly the tokens vLLM's own CPU masking function
   (`apply_top_k_top_p_pytorch`) keeps, on random logits (no engine; ties: ours is a superset).
2. On the folder's shared engine (no new engine): groups sampled with top_p = 0.9, and with top_k,
   are rescored by the learner's `TokenScorer` with the same weights; every token's IS weight
   exp(log π_learner − log μ_vLLM) is within 1e-3 of 1, and without the truncation it is not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.logprobs import OUTSIDE_SUPPORT_LOGPROB, TokenScorer, support_mask

CASES = [(0.7, 0), (0.9, 0), (0.95, 20), (1.0, 5), (0.3, 3), (0.999, 0), (0.5, 99)]


@pytest.mark.parametrize("vocab", [7, 103, 4000])
def test_kept_set_equals_vllm_cpu_masking(vocab):
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    z = 2 * torch.randn(32, vocab, generator=torch.Generator().manual_seed(vocab))
    for top_p, top_k in CASES:
        p = None if top_p >= 1 else torch.full((32,), top_p)
        k = torch.full((32,), top_k, dtype=torch.int32) if 0 < top_k < vocab else None
        vllm_kept = torch.isfinite(apply_top_k_top_p_pytorch(z.clone(), k, p, allow_cpu_sync=True))
        ours = support_mask(z, top_p, top_k)
        ours = torch.ones_like(vllm_kept) if ours is None else ours
        assert torch.equal(ours, vllm_kept), (vocab, top_p, top_k)


def test_top_p_boundary_ties_are_a_superset_of_vllm():
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    # probabilities ∝ e^0 ×3, e^1 ×3, e^2 (sum S = 3 + 3e + e² = 18.5439): the 0.6 nucleus boundary
    # falls inside the three e^1 tokens. In vLLM's order the mass above the 1st of them is e²/S = 0.3985
    # < 0.6 (kept), above the 2nd 0.3985 + e/S = 0.5450 < 0.6 (kept), above the 3rd 0.6916 ≥ 0.6
    # (dropped): vLLM keeps 3 tokens; we keep every token tied with the smallest kept logit: 4.
    z = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0]])
    vllm_kept = torch.isfinite(apply_top_k_top_p_pytorch(z.clone(), None, torch.tensor([0.6]), allow_cpu_sync=True))
    assert vllm_kept.sum() == 3
    assert support_mask(z, 0.6, 0).tolist() == [[False, False, False, True, True, True, True]]


async def sample_with_version(engine, sampler, item, n: int):
    """One group of n rows; a fresh shared engine is first labelled version 0, as an actor would."""
    from actors.luffy import GroupPlan

    if not str(await engine.get_weight_version()).lstrip("-").isdigit():
        await engine.update_weight_version("0")
    return await sampler.sample_group(item, GroupPlan(on_policy=n, demo_rows=0))


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 0.9, 0), (0.8, 0.9, 20), (1.0, 1.0, 10)])
def test_learner_reproduces_vllm_processed_logprobs(host, model_dir, tokenizer, prompts, temperature, top_p, top_k):
    from actors.generate import GroupSampler, SamplingSettings
    from learner.fsdp import load_causal_lm

    settings = SamplingSettings(temperature=temperature, top_p=top_p, max_tokens=24, top_k=top_k)
    sampler = GroupSampler(host.engine, tokenizer, settings, reward_fn=lambda prompt, text, truth, extra: 0.0, seed=top_k)
    try:
        item = prompts[top_k % len(prompts)]
        samples, _ = host.call(sample_with_version(host.engine, sampler, item, 4), timeout_s=300)
    finally:
        sampler.close()

    lm = load_causal_lm(model_dir, torch.float32)
    scorer = TokenScorer(lm, temperature=temperature, top_p=top_p, top_k=top_k)
    plain = TokenScorer(lm, temperature=temperature)
    prompt = list(item.prompt_ids)
    deviation, untruncated = [], []
    for s in samples:
        assert len(set(s.versions.tolist())) == 1  # one weight version per row (no update happened)
        ids = torch.tensor([prompt + s.tokens.tolist()])
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(s.tokens))
        targets = torch.as_tensor(s.tokens, dtype=torch.long)
        with torch.no_grad():
            ours = scorer(ids, None, positions, targets)[0].numpy()
            ref = plain(ids, None, positions, targets)[0].numpy()
        assert (ours > OUTSIDE_SUPPORT_LOGPROB).all()  # every sampled token is inside our kept set
        deviation.append(np.abs(np.exp(ours - s.logprobs) - 1))
        untruncated.append(np.abs(np.exp(ref - s.logprobs) - 1))
    deviation, untruncated = np.concatenate(deviation), np.concatenate(untruncated)
    print(f"T={temperature} top_p={top_p} top_k={top_k}: {deviation.size} tokens, max |w − 1| = "
          f"{deviation.max():.2e} (temperature-only log-probs: {untruncated.max():.2e})")
    assert deviation.max() < 1e-3
    assert untruncated.max() > 1e-2  # the truncation matters here: the test can fail
