"""Rollout deadlines (`actors.deadlines`, `rollout.deadlines`): the `auto` rule, a sample that stalls is aborted and
regenerated, a group past its retries is dropped and its prompt re-queued, a wedged engine is reported dead, a
weight push's pause is not a stall, a queued sample is not one either. No vLLM engine: `StallEngine` keeps the
front-end state the watchdog reads, and its samples stall where a test says."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from actors.deadlines import (
    DeadlineClock,
    DecodeRate,
    PausingEngine,
    auto_deadlines,
    limits_of,
)
from actors.generate import GroupDropped, GroupSampler, SamplingSettings
from actors.luffy import GroupPlan
from actors.prompts import PromptItem
from configs.deadlines import DeadlinesConfig

STEP_S = 0.01  # the fake engine's decode step


class Tokens:
    def __init__(self):
        self.n = 0

    def num_output_tokens(self):
        return self.n


class StallEngine:
    """An `AsyncLLM` stand-in with vLLM's front-end state: a request's n samples are sequences in
    `output_processor.request_states` (listed under the request id in `external_req_ids`, each with its
    `request_index`) that gain a token every STEP_S. `plan(request number, sample index)` -> dict of `length`
    (tokens to finish, 4), `stall_after` (tokens after which it gets none), `queued` (no token while another
    sample of the engine decodes). `stopped` (a wedge, a weight push's pause) holds every sample; `hung`: its
    engine core answers no call (a stopped process)."""

    def __init__(self, plan=lambda number, index: {}):
        self.output_processor = SimpleNamespace(request_states={}, external_req_ids={})
        self.plan, self.stopped, self.hung, self.requests, self.aborted = plan, False, False, [], []
        self.errored = False

    async def get_weight_version(self):
        return "0"

    async def is_paused(self):
        while self.hung:
            await asyncio.sleep(1)
        return self.stopped

    async def pause_generation(self, mode="keep", clear_cache=True):
        self.stopped = True

    async def resume_generation(self):
        self.stopped = False

    async def generate(self, prompt, params, request_id):
        out, number = self.output_processor, len(self.requests)
        self.requests.append((request_id, params.n))
        states = {}
        for i in range(params.n):
            plan = {"length": 4, "stall_after": None, "queued": False, **self.plan(number, i)}
            states[f"{i}_{request_id}-x"] = SimpleNamespace(request_index=i, detokenizer=Tokens(), end=None, **plan)
        out.request_states.update(states)
        out.external_req_ids[request_id] = list(states)
        while any(s.end is None for s in states.values()):
            try:
                await asyncio.sleep(STEP_S)
            except asyncio.CancelledError:  # as vLLM does: a cancelled request is aborted
                await self.abort([i for i, s in states.items() if s.end is None])
                raise
            busy = any(not s.queued for s in out.request_states.values())
            for i, s in states.items():
                if s.end or self.stopped or (s.queued and busy) or s.detokenizer.n == s.stall_after:
                    continue
                s.detokenizer.n += 1
                if s.detokenizer.n == s.length:
                    s.end = "stop"
                    self._forget(i)
        comps = [SimpleNamespace(index=s.request_index, token_ids=[7] * s.detokenizer.n, finish_reason=s.end,
                                 logprobs=[{7: SimpleNamespace(logprob=-0.5)}] * s.detokenizer.n,
                                 weight_versions=[SimpleNamespace(version="0", start=0, end=s.detokenizer.n)])
                 for s in states.values()]
        yield SimpleNamespace(finished=True, outputs=comps)

    async def abort(self, ids, internal=False):
        for i in ids:
            state = self._forget(i)
            if state is not None:
                state.end = "abort"
                self.aborted.append(i)

    def _forget(self, i):
        out = self.output_processor
        state = out.request_states.pop(i, None)
        if state is not None:
            out.external_req_ids[i.split("_", 1)[1][:-2]].remove(i)
        return state


class Tok:
    eos_token_id = 0

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["x"] * len(ids)


def sampler_on(engine, progress_s=0.3, group_s=None, retries=1):
    return GroupSampler(engine, Tok(), SamplingSettings(max_tokens=64), reward_fn=lambda *a: 1.0,
                        deadlines=DeadlinesConfig(progress_s=progress_s, group_s=group_s, retries=retries))


def group(sampler, on_policy=4, guided=()):
    item = PromptItem(3, (5, 6), "1", demo_ids=(8, 9, 10, 0))
    plan = GroupPlan(on_policy=on_policy, demo_rows=0, guided=list(guided), ratios=[0.0] * on_policy + list(guided))
    return sampler.sample_group(item, plan)


def test_the_auto_rule():
    # progress_s = max(30, 32 × s/token); group_s = max(120, 4 × max_response_tokens × s/token)
    assert auto_deadlines(None, 1024) == (120.0, None)  # not measured yet: the warm-up deadline, no budget
    assert auto_deadlines(0.05, 1024) == (30.0, pytest.approx(204.8))  # 32 × 0.05 = 1.6 < 30; 4 × 1024 × 0.05
    assert auto_deadlines(2.0, 128) == (64.0, 1024.0)  # 32 × 2 = 64; 4 × 128 × 2 = 1024
    assert auto_deadlines(0.01, 128) == (30.0, 120.0)  # 4 × 128 × 0.01 = 5.12 < 120
    assert limits_of(DeadlinesConfig(progress_s=12, group_s="auto"), 0.05, 1024) == (12.0, pytest.approx(204.8))
    assert limits_of(DeadlinesConfig(progress_s="auto", group_s=None), 2.0, 128) == (64.0, None)
    rate = DecodeRate()
    assert rate.step_s is None
    rate.observe(10.0, 100)
    assert rate.step_s == pytest.approx(0.1)
    rate.observe(2.0, 100)  # (0.9 × 10 + 2) / (0.9 × 100 + 100) = 11 / 190
    assert rate.step_s == pytest.approx(11 / 190)


def test_a_stalled_sample_is_aborted_and_regenerated_alone():
    """Sample 2 of the group's request stops after 2 tokens: past progress_s it is aborted, and one request of
    n=1 regenerates it; the group comes back whole, and only the finished request was a rate measurement."""
    engine = StallEngine(lambda number, index: {"stall_after": 2} if (number, index) == (0, 2) else {})
    sampler = sampler_on(engine)
    samples, _ = asyncio.run(group(sampler))
    sampler.close()
    assert [n for _, n in engine.requests] == [4, 1]
    assert [len(s.tokens) for s in samples] == [4, 4, 4, 4]
    assert [s.finish_reason for s in samples] == ["stop"] * 4
    assert len(engine.aborted) == 1 and engine.aborted[0].startswith("2_")
    assert sampler.deadline_stats() == {"requests_aborted": 1, "members_regenerated": 1}
    assert sampler.rate.step_s is not None and sampler.wedged is None


def test_past_its_retries_a_group_is_dropped_and_nothing_of_it_runs_on():
    """Sample 0 stalls every time: regenerated `retries` = 1 time, then `GroupDropped`; the group's guided
    request (a long one) is cancelled, not left generating."""
    def plan(number, index):
        if number == 1:  # the guided row's request, submitted second
            return {"length": 10_000}
        return {"stall_after": 1} if index == 0 else {}

    engine = StallEngine(plan)
    sampler = sampler_on(engine, retries=1)
    with pytest.raises(GroupDropped, match=r"prompt 3: samples \[0\] were aborted after 1 regeneration"):
        asyncio.run(group(sampler, on_policy=2, guided=[0.5]))
    sampler.close()
    assert [n for _, n in engine.requests] == [2, 1, 1]  # the group's request, the guided row, one regeneration
    assert engine.output_processor.request_states == {}  # the guided request was aborted with the group
    assert engine.aborted[-1] == "0_actor-p-1-x"
    assert sampler.deadline_stats() == {"requests_aborted": 2, "members_regenerated": 1}


def test_a_group_past_its_budget_has_its_unfinished_samples_aborted():
    """Sample 1 keeps decoding but would need 10,000 steps: progress_s never fires, group_s does."""
    engine = StallEngine(lambda number, index: {"length": 10_000} if (number, index) == (0, 1) else {})
    sampler = sampler_on(engine, progress_s=None, group_s=0.3)
    samples, _ = asyncio.run(group(sampler, on_policy=2))
    sampler.close()
    assert [n for _, n in engine.requests] == [2, 1] and len(samples) == 2
    assert sampler.deadline_stats() == {"requests_aborted": 1, "members_regenerated": 1}


def test_a_wedged_engine_drops_the_group_and_says_why():
    """Nothing progresses and the engine core answers nothing (its process stopped): after progress_s and the
    unanswered call every sample is aborted, none is regenerated, the group is dropped, and `wedged` says why."""
    engine = StallEngine()
    engine.stopped = engine.hung = True
    sampler = sampler_on(engine, retries=2)
    t0 = time.monotonic()
    with pytest.raises(GroupDropped, match=r"its engine produced no token for 0\.[34]\d*s with 4 rollout sequences in flight, and did not "
                                             r"answer within 0\.075s"):
        asyncio.run(group(sampler))
    assert time.monotonic() - t0 < 2.0  # 0.3 s deadline + 0.075 s unanswered + ticks
    sampler.close()
    assert len(engine.requests) == 1 and len(engine.aborted) == 4
    assert sampler.wedged.endswith("(rollout.deadlines.progress_s 0.3s)")
    assert sampler.deadline_stats() == {"requests_aborted": 4, "members_regenerated": 0}


def test_an_engine_that_answers_is_not_wedged_by_one_stalled_sample():
    """The group's last sequence stalls alone, so the engine produces nothing for progress_s, but its core
    answers: the sample is aborted and regenerated, and the engine is not wedged."""
    engine = StallEngine(lambda number, index: {"stall_after": 1} if (number, index) == (0, 0) else {})
    sampler = sampler_on(engine)
    samples, _ = asyncio.run(group(sampler, on_policy=2))
    sampler.close()
    assert len(samples) == 2 and sampler.wedged is None
    assert sampler.deadline_stats() == {"requests_aborted": 1, "members_regenerated": 1}


def test_a_weight_push_pause_is_not_a_stall():
    """The engine stands still for 0.8 s, longer than progress_s = 0.3, inside a weight push's pause (the
    receiver's engine is a `PausingEngine` on the sampler's clock): nothing is aborted, the engine is not wedged."""
    engine = StallEngine(lambda number, index: {"length": 20})
    sampler = sampler_on(engine)

    async def push_meanwhile():
        task = asyncio.ensure_future(group(sampler))
        await asyncio.sleep(0.05)
        receiver_engine = PausingEngine(engine, sampler.clock)
        await receiver_engine.pause_generation(mode="keep")
        await asyncio.sleep(0.8)
        await receiver_engine.resume_generation()
        return await task

    samples, _ = asyncio.run(push_meanwhile())
    sampler.close()
    assert len(samples) == 4 and sampler.wedged is None
    assert sampler.deadline_stats() == {"requests_aborted": 0, "members_regenerated": 0}


def test_a_queued_sample_is_left_to_the_group_budget():
    """Sample 1 gets no token while the others decode (queued behind them for 0.6 s, longer than progress_s):
    it has not started, so the progress deadline leaves it alone."""
    def plan(number, index):
        return {"queued": True} if index == 1 else {"length": 60}

    engine = StallEngine(plan)
    sampler = sampler_on(engine)
    samples, _ = asyncio.run(group(sampler, on_policy=3))
    sampler.close()
    assert [len(s.tokens) for s in samples] == [60, 4, 60]
    assert sampler.deadline_stats() == {"requests_aborted": 0, "members_regenerated": 0}


def test_the_clock_stands_still_while_paused():
    clock = DeadlineClock()
    clock.pause()
    t = clock.now()
    time.sleep(0.05)
    assert clock.now() == t
    clock.resume()
    assert 0 <= clock.now() - t < 0.05


def test_an_actor_requeues_a_dropped_group_and_reports_a_wedged_engine_dead(monkeypatch, tmp_path):
    """The actor's side: its weight receiver pauses the deadlines' clock with the engine; a group dropped on a
    wedged engine gives its credit back and its prompt is the next one served (same epoch), the actor starts
    no further prompt, and its stats carry `engine_dead` = why, the field the driver's health check reads to
    replace it."""
    import weightsync.receiver
    from actors import core
    from actors.link import Backoff
    from configs.schema import RunConfig

    class Receiver:  # the receiver's engine is all this looks at
        def __init__(self, engine, *args, **kwargs):
            receivers.append(engine)

        async def init(self):
            return 1

    receivers = []
    monkeypatch.setattr(weightsync.receiver, "WeightReceiver", Receiver)
    monkeypatch.setattr(core, "load_tokenizer", lambda *a: Tok())
    engine = StallEngine()
    engine.stopped = engine.hung = True
    items = [PromptItem(0, (5, 6), "1"), PromptItem(1, (5, 7), "2")]
    cfg = RunConfig(rollout={"n": 2, "deadlines": {"progress_s": 0.3}})

    async def wedged_actor():
        actor = core.AsyncActor(cfg, 0, str(tmp_path), "tcp://127.0.0.1:9", items, num_actors=1,
                                reward_fn=lambda *a: 1.0)
        await actor.start(engine)
        await actor.connect_weight_sync("127.0.0.1", 9, "token")
        assert isinstance(receivers[0], PausingEngine) and receivers[0]._clock is actor.sampler.clock
        first = actor.cursor.next_keyed()
        await actor._rollout(*first)
        stop_waiter = asyncio.ensure_future(actor._stop.wait())
        started = await actor._admit(None, 4, Backoff(0.05, 1.0), stop_waiter)
        stop_waiter.cancel()
        out = first, actor.cursor.next_keyed(), started, actor.stats()
        actor._push_task.cancel()
        actor.sampler.close()
        actor.link.close()
        actor.credit_link.close()
        return out

    first, again, started, stats = asyncio.run(wedged_actor())
    assert again == first and started == 0
    assert stats["groups_requeued"] == 1 and stats["credits_held"] == 1 and stats["groups_failed"] == 0
    assert stats["requests_aborted"] == 2 and stats["members_regenerated"] == 0
    assert stats["engine_dead"].startswith("its engine produced no token for ")


def test_a_reward_that_hangs_is_a_timeout_not_a_wedge(tmp_path, caplog):
    """One response of the group makes the run's reward hang: its worker is killed at reward.timeout_s, the
    response scores 0 and counts in reward_timeouts (logged once), and the group is delivered with the others'
    rewards."""
    import logging

    from tasks.rewards import Scorer

    path = tmp_path / "hanging_reward.py"
    path.write_text("import time\n\ndef score(prompt, response, ground_truth, extra):\n"
                    "    if len(response) == 5:\n        time.sleep(600)\n    return 1.0\n")

    class LengthTok(Tok):
        def batch_decode(self, ids, skip_special_tokens=True):
            return ["x" * len(i) for i in ids]

    engine = StallEngine(lambda number, index: {"length": 5} if index == 1 else {})
    scorer = Scorer(f"{path}:score", timeout_s=0.5)
    sampler = GroupSampler(engine, LengthTok(), SamplingSettings(max_tokens=64), reward_fn=scorer)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tasks.rewards"):
        samples, _ = asyncio.run(group(sampler, on_policy=3))
    sampler.close()
    assert time.monotonic() - t0 < 30  # 0.5 s limit + two worker start-ups, not 600 s
    assert [s.reward for s in samples] == [1.0, 0.0, 1.0]
    assert sampler.reward_stats() == {"reward_errors": 0, "reward_timeouts": 1, "reward_first_error": None}
    assert [r.message for r in caplog.records if "timed out" in r.message] == [
        f"reward {path}:score timed out, scored 0 (reward/timeouts; later ones are only counted): "
        f"{path}:score took longer than 0.5 s"]
