"""Helpers of the actor tests: recording what an actor produced, pulling everything back, HF log-probs."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import torch


def on_actor_loop(actor, coro_fn):
    """Run `coro_fn(actor.core)` (an async function of the `AsyncActor`) on the actor's loop and return
    its result: for tests that need the engine or the core directly."""
    return actor._call(coro_fn(actor.core))


def wait_rollouts(actor, timeout_s: float | None = None) -> int:
    """Wait until the background rollouts of `actor.start_rollouts(max_groups)` finished (all groups
    delivered); returns the prompts started. TimeoutError after `timeout_s`."""
    async def wait(core):
        if core._run_task is None:
            raise RuntimeError(f"{core.name}: no background rollouts (start_rollouts first)")
        return await asyncio.wait_for(asyncio.shield(core._run_task), timeout_s)

    return on_actor_loop(actor, wait)


def wait_delivered(actor, timeout_s: float | None = None) -> bool:
    """Wait until every finished group of `actor` was acknowledged by the buffer (False on timeout)."""
    return on_actor_loop(actor, lambda core: core.outbox.drain(timeout_s))


def record_sent(actor) -> dict:
    """Wrap the actor's delivery callback: returns {group_id: (Group, Ack)} filled as the buffer acknowledges."""
    sent: dict = {}
    core = actor.core
    original = core.outbox.on_sent

    def on_sent(group, ack):
        sent[group.group_id] = (group, ack)
        original(group, ack)

    core.outbox.on_sent = on_sent
    return sent


def wait_for(pred, timeout_s: float, what: str, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what() if callable(what) else what}")


def pull_all(client, timeout_s: float = 5.0) -> list:
    """Every group the buffer holds right now."""
    n = client.stats()["occupancy_groups"]
    return client.pull_batch(n, timeout_s) if n else []


def assert_same_group(a, b) -> None:
    """Everything the actor produced arrives unchanged (bitwise for arrays)."""
    assert (a.group_id, a.prompt_index, a.ground_truth, a.data_source, a.actor_id) == \
           (b.group_id, b.prompt_index, b.ground_truth, b.data_source, b.actor_id)
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    assert a.n <= b.n
    for sa, sb in zip(a.samples, b.samples):
        for f in ("tokens", "logprobs", "versions", "prefix_mask"):
            x, y = getattr(sa, f), getattr(sb, f)
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f"{a.group_id}.{f} changed in transit"
        assert (sa.reward, sa.finish_reason, sa.truncated) == (sb.reward, sb.finish_reason, sb.truncated)
    for k, v in a.meta.items():
        assert b.meta[k] == v


def hf_token_logprobs(model, prompt_ids, response_ids, temperature: float = 1.0) -> np.ndarray:
    """log softmax(logits / temperature) of each response token given prompt + earlier response tokens."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].double() / temperature
    lp = torch.log_softmax(logits, -1)
    p = len(prompt_ids)
    pos = torch.arange(p - 1, p - 1 + len(response_ids))
    return lp[pos, torch.tensor(list(response_ids))].numpy()


def load_hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
