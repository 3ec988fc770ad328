"""Reward functions written as veRL and TRL users write them, for the end-to-end runs of `test_train_e2e.py`
(`reward.fn=tests/e2e/field_rewards.py:NAME`): LUFFY scores with `compute_score`, PRIME with
`group_parity`. The data is MATH-500 as shipped: data_source "math500" (the file's stem), extra_info
``id``, ``level``, ``type``."""

from tasks.math_worker import score as math_verify_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """veRL style: a scorer per data source, a dict result. Bound by position (the old binding), data_source
    was the prompt text and every call raised; here MATH-500's teacher solutions score 1 by math-verify."""
    if data_source != "math500" or not extra_info["id"].startswith("test/"):
        raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
    return {"score": math_verify_score("", solution_str, ground_truth, {}), "level": extra_info["level"]}


def group_parity(prompts, completions, ground_truth, **kwargs):
    """TRL style, batched: 1.0 where len(completion) + len(ground truth) + len(MATH-500 id) is a multiple of
    the batch's size -- a reward the test recomputes from samples.jsonl, that reads a column from kwargs and
    that tells a whole group (rollout.n completions a call) from one-element calls (every sum a multiple of 1)."""
    return [float((len(c) + len(g) + len(i)) % len(completions) == 0)
            for c, g, i in zip(completions, ground_truth, kwargs["id"])]


def odd_length(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when response and ground truth have an odd number of characters together: a deterministic reward
    that keeps some of an untrained teacher's traces and rejects others, so `test_live_teacher_e2e.py` can
    recompute which."""
    return float((len(solution_str) + len(ground_truth)) % 2 == 1)
