"""Deadlines of rollout requests: a progress deadline per sequence, a wall budget per attempt at a group, and
the detection of an engine that no longer produces anything (`rollout.deadlines`).

Why: only `rollout.max_response_tokens` bounded a rollout. A request that stops making progress would hold its
group, the credit it took, and at max_staleness 0 the learner, for ever. `Watchdog` aborts such requests (vLLM's
`AsyncLLM.abort` of the sequence); `actors.generate.GroupSampler` regenerates the aborted members, and past
`rollout.deadlines.retries` drops the group so the actor puts its prompt back into its shard
(`actors.prompts.PromptCursor.requeue`): no part of a group is ever delivered, and its prompt is never lost.

What counts as progress, read without touching the hot path: requests ask vLLM for their final output only
(`actors.generate`), so no output reaches the actor while a sequence decodes. vLLM's front end still keeps each
sequence's tokens so far (`vllm/v1/engine/output_processor.py`: `OutputProcessor.request_states[id]
.detokenizer.num_output_tokens()`, updated for every engine step whatever the output kind; a group's n samples
are n child sequences `request_states` holds under internal ids that `external_req_ids[request id]` lists, each
with its `request_index`). The watchdog reads those counts once per tick (1 s, or a quarter of the deadline
when that is shorter): no per-token work is added anywhere.

The rules, on the actor's clock (`DeadlineClock`: monotonic time with the weight pushes' pauses taken out,
since a paused engine makes no progress by design):
  - a sequence that has produced a token and then none for `progress_s` (counted from the engine's last resume
    after a push when that is later: the sequence may wait for its re-prefill) is aborted. A sequence still waiting
    for its first token is queued behind others (or prefilling) and is left to the group budget: aborting it
    would only queue it again;
  - an attempt (the group's request, or one regeneration of its aborted members) still unfinished after
    `group_s` has its unfinished sequences aborted;
  - an engine with rollout sequences in flight that produced no token for any request, and finished none, for
    `progress_s`, and then does not answer a call to its engine-core process within a quarter of `progress_s`
    (vLLM's `is_paused`, answered between engine steps), is wedged (e.g. that process stopped): all its rollout
    sequences are aborted and `wedged` says why, for good. (An engine that answers only has stalled sequences,
    which the first rule handles: a healthy engine steps every running sequence together.) The actor then starts no prompt and reports its engine dead through its
    stats (`engine_dead`), which the driver's health check reads (`launch.processes.process_graph.actor_stats`):
    it replaces the actor. An engine frozen inside a weight push stops this clock too; that one is caught by the
    push's own deadline (`weight_sync.timeout_s`), which blames the actor. So does one blocked in the join of a
    weight-sync group (`PausingEngine`): the rebuild's deadline and its cancel (`weight_sync.connect_timeout_s`,
    `weightsync.liveness.unformed_probe`) end that one.

`auto` (`auto_deadlines`), from the engine's measured seconds per token of one sequence (`DecodeRate`: each
finished rollout request's time from submission to its end over its longest sample, so time queued and
prefilling counts; weighted by tokens, decayed by 0.9 per request):
  progress_s = max(PROGRESS_FLOOR_S, PROGRESS_TOKENS × s/token)
      a decoding sequence gets a token every engine step; 32 steps without one is far outside a healthy
      engine's jitter (a preempted sequence waits for room, seconds), and the 30 s floor covers a step
      stretched by a long prefill, garbage collection, or a loaded host;
  group_s = max(GROUP_FLOOR_S, GROUP_FACTOR × max_response_tokens × s/token)
      an attempt may wait about one whole response for a free slot, then decodes at most max_response_tokens:
      twice the expected time, doubled again for the tail;
  before any request was measured (the engine's first batches also warm it up): progress_s =
  WARMUP_PROGRESS_S, group_s none (nothing to derive it from).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

PROGRESS_FLOOR_S = 30.0
PROGRESS_TOKENS = 32
GROUP_FLOOR_S = 120.0
GROUP_FACTOR = 4.0
WARMUP_PROGRESS_S = 120.0
RATE_DECAY = 0.9
TICK_S = 1.0


def auto_deadlines(step_s: float | None, max_tokens: int) -> tuple[float, float | None]:
    """(progress_s, group_s) of `auto` for an engine measured at `step_s` seconds per token of one sequence
    (None: not measured yet) and responses of at most `max_tokens` (module docstring)."""
    if step_s is None:
        return WARMUP_PROGRESS_S, None
    return (max(PROGRESS_FLOOR_S, PROGRESS_TOKENS * step_s),
            max(GROUP_FLOOR_S, GROUP_FACTOR * max_tokens * step_s))


def limits_of(deadlines, step_s: float | None, max_tokens: int) -> tuple[float | None, float | None]:
    """(progress_s, group_s) in force under `deadlines` (a `configs.deadlines.DeadlinesConfig`): its seconds, or
    `auto_deadlines` where it says auto; None = none."""
    auto = auto_deadlines(step_s, max_tokens)
    return tuple(a if v == "auto" else v for v, a in zip((deadlines.progress_s, deadlines.group_s), auto))


class DecodeRate:
    """Seconds per token of one sequence, from finished requests (module docstring)."""

    def __init__(self) -> None:
        self._seconds = self._tokens = 0.0

    def observe(self, seconds: float, tokens: int) -> None:
        if tokens > 0:
            self._seconds = RATE_DECAY * self._seconds + seconds
            self._tokens = RATE_DECAY * self._tokens + tokens

    @property
    def step_s(self) -> float | None:
        return self._seconds / self._tokens if self._tokens else None


class DeadlineClock:
    """Monotonic seconds that stand still while the engine is paused for a weight push. `resumed`: the clock
    time of the last resume (None before any), from which sequences' progress is measured again."""

    def __init__(self) -> None:
        self._paused_total = 0.0
        self._paused_at: float | None = None
        self.resumed: float | None = None

    def now(self) -> float:
        t = time.monotonic() if self._paused_at is None else self._paused_at
        return t - self._paused_total

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._paused_total += time.monotonic() - self._paused_at
            self._paused_at = None
            self.resumed = self.now()


class PausingEngine:
    """The engine as the weight receiver sees it: its `pause_generation` stops the deadline clock and its
    `resume_generation` restarts it (a pause that fails restarts it too); `init_weight_transfer_engine` (the
    join of a weight-sync group) stops the clock while it runs; everything else is the engine's.

    Why the join: vLLM runs it as a utility call on the engine-core loop (`v1/engine/core.py`, the uniproc
    executor's `collective_rpc`), so the engine produces no token and answers no `is_paused` until every rank
    of the group has joined, up to `weight_sync.connect_timeout_s` when one never does (an actor that died
    mid-rebuild). With the clock running, every live engine of a stalled rebuild was declared wedged for good
    after `progress_s` and the whole fleet replaced; a join that fails is the rebuild's to report."""

    def __init__(self, engine, clock: DeadlineClock) -> None:
        self._engine, self._clock = engine, clock

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def init_weight_transfer_engine(self, *args, **kwargs):
        self._clock.pause()
        try:
            return await self._engine.init_weight_transfer_engine(*args, **kwargs)
        finally:
            self._clock.resume()

    async def pause_generation(self, *args, **kwargs):
        self._clock.pause()
        try:
            return await self._engine.pause_generation(*args, **kwargs)
        except BaseException:
            self._clock.resume()
            raise

    async def resume_generation(self, *args, **kwargs):
        try:
            return await self._engine.resume_generation(*args, **kwargs)
        finally:
            self._clock.resume()


def pausing(engine, clock: DeadlineClock | None):
    """`engine` for the weight receiver: a `PausingEngine` on `clock`, or the engine itself without deadlines."""
    return engine if clock is None else PausingEngine(engine, clock)


@dataclass
class Attempt:
    """One watched rollout request: when it started (clock seconds) and the members the watchdog aborted
    ({request_index: why})."""

    started: float
    aborted: dict[int, str] = field(default_factory=dict)


class Watchdog:
    """Applies the deadlines (module docstring) to the rollout requests `watch`ed on one engine.
    `limits()`: the current (progress_s, group_s), None = none."""

    def __init__(self, engine, limits: Callable[[], tuple[float | None, float | None]], clock: DeadlineClock,
                 name: str = "actor"):
        self.engine, self.limits, self.clock, self.name = engine, limits, clock, name
        self.attempts: dict[str, Attempt] = {}
        self.wedged: str | None = None
        self.counts = {"requests_aborted": 0}
        self._tokens: dict[str, int] = {}  # tokens of every sequence of the engine at the last tick
        self._since: dict[str, float] = {}  # when each got its last token (or was first seen)
        self._cut: set[str] = set()  # sequences aborted here (their disappearance is no progress)
        self._last_progress = clock.now()
        self._task: asyncio.Task | None = None
        self.readable = _progress_of(engine) is not None
        if not self.readable:
            logger.warning("%s: rollout deadlines are off: this engine does not expose vLLM's per-sequence "
                           "progress (OutputProcessor.request_states)", name)

    def watch(self, request_id: str) -> Attempt:
        """Start watching a rollout request (before it is submitted); `done` ends it."""
        if not self.attempts:
            self._last_progress = self.clock.now()  # an idle engine made no progress, and needed none
        if self._task is None and self.readable:
            self._task = asyncio.create_task(self._run(), name=f"{self.name}-deadlines")
        attempt = self.attempts[request_id] = Attempt(self.clock.now())
        return attempt

    def done(self, request_id: str, finished: bool) -> None:
        """The request's stream ended; `finished`: with output (progress), not by an error."""
        self.attempts.pop(request_id, None)
        if finished:
            self._last_progress = self.clock.now()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                await self._tick()
        except asyncio.CancelledError:
            raise
        except Exception:  # vLLM's front-end state not as read here (another vLLM version?): say so, once
            logger.exception("%s: rollout deadlines are off from now on: reading the engine's progress failed",
                             self.name)

    async def _tick(self) -> None:
        """Wait one tick, then apply the rules (module docstring) and abort what they name."""
        progress_s, group_s = self.limits()
        await asyncio.sleep(min(TICK_S, *(x / 4 for x in (progress_s, group_s) if x)))
        watched = self._observe()
        idle = self.clock.now() - self._last_progress
        if progress_s is not None and watched and idle > progress_s and self.wedged is None:
            if not await self._answers(progress_s / 4):
                self._wedge(f"its engine produced no token for {idle:.3g}s with {len(watched)} rollout "
                            f"sequences in flight, and did not answer within {progress_s / 4:.3g}s "
                            f"(rollout.deadlines.progress_s {progress_s:.3g}s)")
            watched = self._observe()  # (requests may have ended meanwhile)
        cut = self._cuts(watched, progress_s, group_s)
        if cut:
            try:
                await self.engine.abort(list(cut), internal=True)
            except Exception:  # a dead engine: its requests end with its error anyway
                logger.exception("%s: aborting %d stalled sequences failed", self.name, len(cut))

    async def _answers(self, timeout_s: float) -> bool:
        """Whether the engine core answers a call (vLLM's `is_paused`, a round trip to its process) in time."""
        try:
            await asyncio.wait_for(self.engine.is_paused(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        except Exception:  # a dead engine: the generate calls raise its error
            return True

    def _wedge(self, why: str) -> None:
        self.wedged = why
        logger.error("%s: %s: its rollout sequences are aborted; the actor starts no more prompts and reports its "
                     "engine dead", self.name, why)

    def _observe(self) -> dict[str, tuple[str, int]]:
        """Read the engine's progress (module docstring) and return the watched requests' unfinished sequences,
        {internal id: (request id, sample index)}."""
        now = self.clock.now()
        tokens = _progress_of(self.engine)
        progressed = any(k > self._tokens.get(i, k) for i, k in tokens.items()) or any(
            i not in tokens and i not in self._cut for i in self._tokens)
        self._since = {i: now if k > self._tokens.get(i, -1) else self._since[i] for i, k in tokens.items()}
        self._tokens, self._cut = tokens, self._cut & tokens.keys()
        watched = {i: (rid, index) for rid, index, i in self._members()}
        if progressed or not watched:
            self._last_progress = now
        return watched

    def _cuts(self, watched: dict[str, tuple[str, int]], progress_s: float | None,
              group_s: float | None) -> dict[str, str]:
        """{internal id: why} of the watched sequences to abort now (recorded in their `Attempt`s and counted;
        one log line per request)."""
        now = self.clock.now()
        cut: dict[str, str] = {}
        for i, (rid, index) in watched.items():
            if self.wedged is not None:
                why = "the engine is wedged"
            elif progress_s is not None and self._tokens[i] > 0 and now - self._quiet_since(i) > progress_s:
                why = f"no new token for {now - self._quiet_since(i):.3g}s (progress_s {progress_s:.3g}s)"
            elif group_s is not None and now - self.attempts[rid].started > group_s:
                why = f"unfinished after {now - self.attempts[rid].started:.3g}s (group_s {group_s:.3g}s)"
            else:
                continue
            cut[i] = why
            self.attempts[rid].aborted[index] = why
        for rid in {watched[i][0] for i in cut}:
            mine = [i for i in cut if watched[i][0] == rid]
            logger.warning("%s: request %s: aborted sample(s) %s: %s", self.name, rid,
                           sorted(watched[i][1] for i in mine), cut[mine[0]])
        self._cut |= cut.keys()
        self.counts["requests_aborted"] += len(cut)
        return cut

    def _quiet_since(self, i: str) -> float:
        """Since when sequence `i` counts as without progress: its last token, or the last resume of the engine
        when later. After a push that drops the KV cache (`weight_sync.clear_cache`) every kept sequence waits
        for its re-prefill behind all the others, with its tokens so far > 0; measured from its last token
        before the push, a long re-prefill queue would cut healthy sequences (review gpu_path_3 F2)."""
        resumed = self.clock.resumed
        return self._since[i] if resumed is None else max(self._since[i], resumed)

    def _members(self):
        """(request id, sample index, internal sequence id) of the watched requests' unfinished sequences."""
        out = self.engine.output_processor
        for rid in self.attempts:
            for i in out.external_req_ids.get(rid, ()):
                state = out.request_states.get(i)
                if state is not None and i in self._tokens:
                    yield rid, state.request_index, i


def _progress_of(engine) -> dict[str, int] | None:
    """{internal sequence id: tokens so far} of every sequence vLLM's front end holds (module docstring);
    None for an engine without that state."""
    states = getattr(getattr(engine, "output_processor", None), "request_states", None)
    if states is None:
        return None
    return {i: s.detokenizer.num_output_tokens() if s.detokenizer is not None else 0 for i, s in states.items()}
