"""A policy's responses with plain transformers `generate`, for the testbed's preparation (`launch.prep.testbed`):
the warm-up's held-out accuracy checks and the samples the testbed's PRM learns from.

Why not the run's vLLM actors: these are a few hundred short responses of a 3 M-parameter model, once per
cache key, made in the preparing process before any run exists; `generate` needs no engine start (~30 s on
2 cores) and reads the learner's model object directly (its weights between two SFT steps).
"""

from __future__ import annotations

from collections.abc import Sequence


def generate(model, prompts: Sequence[Sequence[int]], *, pad_id: int, eos_id: int, max_new_tokens: int,
             sample: bool, seed: int = 0, batch: int = 64) -> list[list[int]]:
    """The response token ids of each prompt (token ids): greedy, or sampled at temperature 1 with no top-k/top-p
    (the rollout's defaults) from torch's RNG seeded with `seed` (the caller's RNG state is restored). A response
    keeps its eos when one was generated and nothing after it. Prompts are left-padded in batches of `batch`."""
    import torch
    from transformers import GenerationConfig

    options = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
    config = GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_id, **options)
    was_training = model.training
    model.eval()
    out: list[list[int]] = []
    try:
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(seed)
            for at in range(0, len(prompts), batch):
                chunk = [list(p) for p in prompts[at:at + batch]]
                width = max(len(p) for p in chunk)
                ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for r, p in enumerate(chunk):
                    ids[r, width - len(p):] = torch.tensor(p)
                    mask[r, width - len(p):] = 1
                rows = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:]
                for row in rows.tolist():
                    end = row.index(eos_id) + 1 if eos_id in row else len(row)
                    out.append(row[:end])
    finally:
        model.train(was_training)
    return out


def greedy_accuracy(model, tokenizer, prompts: Sequence[Sequence[int]], answers: Sequence[str],
                    max_new_tokens: int) -> float:
    """Share of `prompts` whose greedy response's last \\boxed{} equals its answer (`tasks.reward`, the synthetic
    task's outcome reward): the accuracy a run's greedy held-out evaluation measures."""
    from tasks import reward

    responses = generate(model, prompts, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                         max_new_tokens=max_new_tokens, sample=False)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    return sum(reward(t, a) for t, a in zip(texts, answers, strict=True)) / len(answers)
