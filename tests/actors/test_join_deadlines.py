"""The deadline clock around weight-sync work that is not a push (review gpu_path_3 F1, F2): an engine blocked in
the weight-sync rendezvous (`init_weight_transfer_engine`) is not wedged, and the progress of a sequence after a
push is measured from the resume. No vLLM engine: `StallEngine` (tests/actors/test_deadlines.py) keeps the
front-end state the watchdog reads."""

from __future__ import annotations

import asyncio
import contextlib

from actors.deadlines import PausingEngine
from tests.actors.test_deadlines import StallEngine, group, sampler_on


class JoiningEngine(StallEngine):
    """Its `init_weight_transfer_engine` blocks the engine core for `join_s` (vLLM runs the join as a utility
    call on the engine-core loop: no token is produced and `is_paused` is not answered meanwhile)."""

    join_s = 0.8

    async def init_weight_transfer_engine(self, request):
        self.stopped = self.hung = True
        try:
            await asyncio.sleep(self.join_s)
        finally:
            self.stopped = self.hung = False


def test_an_engine_blocked_in_the_weight_sync_rendezvous_is_not_wedged():
    """F1: the rendezvous holds the engine core for 0.8 s, over 2 x progress_s (0.3 s) plus the 0.075 s the
    watchdog waits for an answer, with four sequences in flight. Today's clock ran through the join: the engine
    was declared wedged for good and the actor replaced. The join now stops the clock as a push's pause does."""
    engine = JoiningEngine(lambda number, index: {"length": 30})
    sampler = sampler_on(engine)

    async def join_meanwhile():
        task = asyncio.ensure_future(group(sampler))
        await asyncio.sleep(0.05)
        await PausingEngine(engine, sampler.clock).init_weight_transfer_engine("init request")
        return await task

    samples, _ = asyncio.run(join_meanwhile())
    sampler.close()
    assert sampler.wedged is None and len(samples) == 4
    assert sampler.deadline_stats() == {"requests_aborted": 0, "members_regenerated": 0}


def test_a_failed_join_restarts_the_clock():
    engine = JoiningEngine()
    engine.join_s = 0.0
    sampler = sampler_on(engine)

    async def failing():
        async def broken(request):
            raise RuntimeError("rendezvous refused")

        engine.init_weight_transfer_engine = broken
        with contextlib.suppress(RuntimeError):
            await PausingEngine(engine, sampler.clock).init_weight_transfer_engine("init request")
        t = sampler.clock.now()
        await asyncio.sleep(0.05)
        return sampler.clock.now() - t

    assert asyncio.run(failing()) > 0.04  # running again
    sampler.close()


def test_progress_after_a_push_is_measured_from_the_resume():
    """F2: a push that drops the KV cache preempts every sequence; each waits for its re-prefill after the
    resume, with its tokens so far > 0. Sample 0 got its last token 0.2 s (clock time) before the pause and
    none for 0.2 s after the resume (its re-prefill queue): 0.4 s in all, over progress_s 0.3, so it was cut
    and regenerated. Its progress deadline now counts from the resume."""
    engine = StallEngine(lambda number, index: {"stall_after": 2} if index == 0 else {"length": 80})
    sampler = sampler_on(engine)

    async def push_meanwhile():
        task = asyncio.ensure_future(group(sampler))
        await asyncio.sleep(0.2)
        receiver_engine = PausingEngine(engine, sampler.clock)
        await receiver_engine.pause_generation(mode="keep")
        await asyncio.sleep(0.3)
        await receiver_engine.resume_generation()
        await asyncio.sleep(0.2)
        for state in engine.output_processor.request_states.values():  # re-prefilled: it decodes again
            state.stall_after = None
        return await task

    samples, _ = asyncio.run(push_meanwhile())
    sampler.close()
    assert len(samples) == 4 and sampler.wedged is None
    assert sampler.deadline_stats() == {"requests_aborted": 0, "members_regenerated": 0}
