"""Rollout deadlines on the folder's real engine (`actors.deadlines`): the watchdog reads vLLM's own front-end
state and aborts vLLM's own child sequences, and an engine core that stops (SIGSTOP, the chaos bench's "stuck"
fault) is found wedged and its group dropped within the deadline; continued, the engine serves again. The
fakes of tests/actors/test_deadlines.py cover the rules; this covers what they assume of vLLM 0.32."""

from __future__ import annotations

import time

import pytest

from actors.generate import GroupDropped, GroupSampler, SamplingSettings
from actors.luffy import GroupPlan
from configs.deadlines import DeadlinesConfig


def engine_core():
    """The engine-core process of the folder's engine (vLLM titles it VLLM::EngineCore)."""
    import psutil

    cores = [p for p in psutil.Process().children(recursive=True)
             if "EngineCor" in p.name() or any("EngineCore" in a for a in p.cmdline())]
    assert len(cores) == 1, cores
    return cores[0]


@pytest.mark.slow
def test_a_stopped_engine_core_is_found_wedged_and_the_engine_serves_again(host, tokenizer, prompts):
    async def labelled():  # a fresh shared engine is labelled version 0 first, as an actor does
        if not str(await host.engine.get_weight_version()).lstrip("-").isdigit():
            await host.engine.update_weight_version("0")

    async def closed(sampler):  # the watchdog's task lives on the host's loop
        sampler.close()

    def sampler(progress_s):
        return GroupSampler(host.engine, tokenizer, SamplingSettings(max_tokens=8), reward_fn=lambda *a: 0.0,
                            deadlines=DeadlinesConfig(progress_s=progress_s, group_s=None, retries=1))

    host.call(labelled(), timeout_s=60)
    plan, item = GroupPlan(on_policy=4, demo_rows=0), prompts[0]
    core, stuck = engine_core(), sampler(2.0)
    core.suspend()
    t0 = time.monotonic()
    try:
        with pytest.raises(GroupDropped, match="its engine produced no token for .* and did not answer within 0.5s"):
            host.call(stuck.sample_group(item, plan), timeout_s=60)
        found_s = time.monotonic() - t0
    finally:
        core.resume()
    host.call(closed(stuck))
    assert found_s < 8  # 2 s without a token, then 0.5 s without an answer, ticks of 0.5 s (slack for load)
    assert stuck.deadline_stats() == {"requests_aborted": 4, "members_regenerated": 0}

    fresh = sampler(30.0)
    samples, _ = host.call(fresh.sample_group(item, plan), timeout_s=120)
    host.call(closed(fresh))
    assert len(samples) == 4 and fresh.wedged is None and fresh.rate.step_s is not None
    assert fresh.deadline_stats() == {"requests_aborted": 0, "members_regenerated": 0}
