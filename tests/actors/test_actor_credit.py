"""The production actor's credit loop against a real buffer process, generation replaced by a timer (the
stand-in of bench/perf/scale.py; no engine): it waits in the buffer's queue instead of polling, restates its
waiting request when newer weights load, stops at once although a long poll is pending, and a long poll
whose buffer dies comes back as BufferDown and is retried against the restarted buffer."""

from __future__ import annotations

import asyncio
import time

from actors.prompts import PromptItem
from bench.perf.scale import SimActor, sim_config
from buffer.client import BufferClient
from buffer.process import start_buffer_process

PROMPTS = [PromptItem(i, (1, 2, 3), "0") for i in range(64)]


async def until(pred, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(pred):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def start(**kw):
    # B = 2, K = 1: (K + 1) · B = 4 units; the actor wants 8 (prompts_in_flight)
    return start_buffer_process(None, batch_prompts=2, max_staleness=1, capacity_groups=8, **kw)


def test_actor_waits_in_the_queue_restates_with_new_weights_and_stops_at_once():
    proc, addr = start()
    learner = BufferClient(addr, "learner", timeout_s=10)

    async def scenario():
        actor = SimActor(sim_config(1, 2, 8), 0, "", addr, PROMPTS, num_actors=1, gen_s=0.05)
        await actor.start()
        actor.start_background()
        stats = learner.stats
        await until(lambda: stats()["groups_in"] == 4 and stats()["pending_credit_requests"] == 1,
                    "4 groups, then a request parked in the buffer")
        asked = actor.counts["credit_requests"]
        await asyncio.sleep(1.0)
        assert actor.counts["credit_requests"] == asked and actor.counts["groups_started"] == 4  # no polling
        await asyncio.to_thread(learner.pull_batch, 2, 5.0)
        await asyncio.to_thread(learner.set_version, 1)
        # the waiting request says version 0: (1 + 0 - 1 + 1) · 2 = 2 slots, 2 queued, nothing for it
        await asyncio.sleep(0.3)
        assert actor.counts["groups_started"] == 4
        actor._loaded(1)  # weights of version 1 load: the request is restated, (1 + 1) · 2 - 2 = 2 units
        await until(lambda: stats()["groups_in"] == 6, "2 more groups after the restated request")
        await until(lambda: stats()["pending_credit_requests"] == 1, "the next request parked")
        assert actor.counts["credit_requests"] == asked + 1  # the restatement was no new request
        t0 = time.monotonic()
        await actor.stop(drain=True)
        assert time.monotonic() - t0 < 5  # the 30 s long poll was cancelled
        s = await asyncio.to_thread(stats)
        assert (s["pending_credit_requests"], s["credits_outstanding"], s["pushes_without_credit"]) == (0, 0, 0)
        await actor.close()

    try:
        asyncio.run(scenario())
    finally:
        learner.close()
        proc.terminate()
        proc.join(10)


def test_a_long_poll_whose_buffer_dies_is_retried_against_the_restarted_buffer():
    proc, addr = start()
    procs = [proc]

    async def scenario():
        actor = SimActor(sim_config(1, 2, 8), 0, "", addr, PROMPTS, num_actors=1, gen_s=0.05)
        await actor.start()
        actor.start_background()
        with BufferClient(addr, "learner", timeout_s=10) as learner:
            await until(lambda: learner.stats()["pending_credit_requests"] == 1, "a request parked")
        procs[0].kill()
        await until(lambda: actor.credit_link.failures >= 1, "the long poll failing with BufferDown", 5.0)
        new, addr2 = start(port=int(addr.rsplit(":", 1)[1]))  # empty, at the same address
        procs.append(new)
        assert addr2 == addr
        with BufferClient(addr, "learner", timeout_s=10) as learner:
            await until(lambda: learner.stats()["groups_in"] >= 2, "groups credited by the new buffer", 30.0)
        await actor.stop(drain=False)
        await actor.close()

    try:
        asyncio.run(scenario())
    finally:
        for p in procs:
            p.terminate()
            p.join(10)
