"""Hand-made batches for the learner tests: real arithmetic prompts, correct and faulty solutions."""

from __future__ import annotations

import numpy as np

from buffer.records import Group, Sample
from configs.schema import RunConfig
from tasks.arithmetic import Problem


def make_cfg(algo: str = "grpo", **sections) -> RunConfig:
    """A RunConfig for learner tests: small micro-batches, fixed seed, no warm-up; `sections` are
    {section: {key: value}} overrides."""
    data = {"algo": algo, "rollout": {"n": 4, "max_response_tokens": 64},
            "learner": {"micro_batch_samples": 4, "lr": 1e-3, "batch_prompts": 2, "steps": 10}}
    if algo == "prime":
        data["buffer"] = {"filter": "accuracy_window"}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return RunConfig.model_validate(data)


PROBLEMS = [Problem(12, "+", 7), Problem(35, "-", 18), Problem(4, "+", 9), Problem(61, "-", 5)]


def _responses(p: Problem, n: int) -> list[tuple[str, float]]:
    good = p.solution
    wrong = good.replace(p.answer, str(p.value + 1))
    variants = [(good, 1.0), (wrong, 0.0), (good[: len(good) // 2], 0.0), (good + "\n\n", 1.0)]
    return [variants[k % len(variants)] for k in range(n)]


def make_groups(tokenizer, n_groups: int = 2, n: int = 4, *, version: int = 0, seed: int = 0,
                demo_rows: int = 0) -> list[Group]:
    """`n_groups` groups of `n` samples; the first `demo_rows` rows of each group get a demonstration
    prefix (LUFFY): their first half is off-policy (prefix_mask, version -1, logprob 0)."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        p = PROBLEMS[g % len(PROBLEMS)]
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}], tokenize=True,
                                               add_generation_prompt=True)
        if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
            prompt = prompt["input_ids"]
        samples = []
        for k, (text, reward) in enumerate(_responses(p, n)):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            t = len(ids)
            prefix = np.zeros(t, dtype=bool)
            if k < demo_rows:
                prefix[: t // 2] = True
            lp = (-rng.uniform(0.5, 4.0, t)).astype(np.float32)
            lp[prefix] = 0.0
            versions = np.full(t, version - (k % 2), dtype=np.int32)
            versions[prefix] = -1
            samples.append(Sample(tokens=np.asarray(ids, dtype=np.int32), logprobs=lp, versions=versions,
                                  prefix_mask=prefix, reward=reward))
        groups.append(Group(group_id=f"g{g}", prompt_index=g, prompt_tokens=np.asarray(prompt, dtype=np.int32),
                            samples=samples, ground_truth=p.answer))
    return groups


def full_weights(learner) -> dict:
    """{HF name: float64 numpy array} of the policy (run on every rank; all get the full weights)."""
    return {k: v.detach().double().cpu().numpy() for k, v in learner.named_full_weights()}


def fail_on_rank_1(learner) -> int:
    if learner.rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    return learner.rank


def rank_info(rank: int, world_size: int, tag: str) -> tuple:
    import os

    if tag == "fail" and rank == 1:
        raise ValueError("rank 1 refuses")
    return rank, world_size, tag, os.environ["MASTER_PORT"]
