"""The rollout loop of one actor (async): credit, bounded concurrency, groups, weights, evaluation.

Why credit before work: the buffer enforces `max_staleness` by admission. The actor asks for credit
(`request_credit(want, actor_version)`) before it starts a prompt and starts at most as many prompts
as it was granted. So stale work is never started, rather than thrown away. A prompt's credit is spent
by the push of its group; credit that ends up unused (stop, failed prompt) is released.

Why a long poll on a second connection: the request waits in the buffer's queue (up to CREDIT_WAIT_S)
until credit is free, and waiting actors share it fairly in arrival order (`buffer.admission`); an
actor that polled with back-off would lose its turn to whoever asked last. It waits on its own
connection (client id `actor-<i>#credit`, the same credit account) so finished groups never queue
behind it. When the actor loads newer weights meanwhile it restates the request, keeping its turn
(a request stated with old weights gets fewer units); on stop it cancels it. Only an answer of 0 that
says the actor is too far behind (more than K versions) makes it wait, for its next weight update.

Why `prompts_in_flight` prompts at once: the engine batches all running requests, so several groups
in flight keep it busy while one group is being scored or pushed. `auto` is sized once the engine is up,
from the KV tokens it reports and the actor's share of the credit (`actors.occupancy`, `configs.concurrency`).

Weight updates go through `weightsync.receiver.WeightReceiver` (pause keep -> load -> resume, requests staying in
flight; a LoRA run's adapter pushes pause nothing, each request keeps its version's adapter: `actors.adapters`).
Per-token versions come from the engine (`actors.rows`). After a failed or aborted push the engine serves weights of
no version until the next complete push: no prompt starts meanwhile. Groups sampled under no version
(`groups_no_version`) or stalled past `rollout.deadlines.retries` (`groups_requeued`) go back into the shard; a
failed rollout is counted (`groups_failed`), not re-queued (a fault of the prompt would come back every time). A
wedged engine (`actors.deadlines`) stops the actor's prompts and is reported as `engine_dead`, which the driver's
health check replaces. Free of Ray and threads: `actors.actor.RolloutActor` runs it on a private event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
import time
import uuid
from collections import deque

import numpy as np

import algos
from actors.adapters import engine_adapters
from actors.engine import EngineSpec, build_engine, shutdown_engine
from actors.generate import GroupDropped, GroupSampler, SamplingSettings
from actors.link import Backoff, BufferDown, BufferLink, ClientFactory, Outbox
from actors.luffy import plain_group_plan, plan_group
from actors.occupancy import InFlight, sized, start_line
from actors.prompts import PromptCursor, PromptItem, load_tokenizer, shard
from actors.rows import NoVersionError
from actors.turns import multiturn_builder
from actors.weights import WeightUpdates
from buffer.admission import CHANNEL, behind
from buffer.records import Group
from tasks.rewards import scorer_for

logger = logging.getLogger(__name__)

CREDIT_WAIT_S = 30.0  # longest wait of one credit request in the buffer's queue; then it is asked again
DELIVERED_KEPT = 1 << 16  # acknowledged groups remembered for `delivered_since`


class AsyncActor(WeightUpdates):
    """One actor: an `AsyncLLM`, its prompt shard, and a link to the buffer. See `actors.actor` for
    the synchronous wrapper and the orchestrator-facing API. `buffer_client`: how the links make their
    clients (`actors.link.BufferLink`; None = the ZMQ `buffer.client.BufferClient`)."""

    def __init__(self, cfg, actor_id: int, model_dir: str, buffer_address: str, prompts: list[PromptItem], *,
                 num_actors: int | None = None, initial_version: int = 0, engine_spec: EngineSpec | None = None,
                 buffer_timeout_s: float = 30.0, reward_fn=None, secrets=None,
                 buffer_client: ClientFactory | None = None):
        self.cfg, self.actor_id = cfg, actor_id
        self.num_actors = num_actors or cfg.rollout.num_actors
        self.spec = engine_spec or EngineSpec.from_config(cfg, model_dir, actor_id)
        self.name = f"actor-{actor_id}"
        self.cursor = PromptCursor(shard(prompts, actor_id, self.num_actors), seed=cfg.seed, actor_id=actor_id)
        self.link = BufferLink(buffer_address, self.name, buffer_timeout_s, secrets, buffer_client)
        self.credit_link = BufferLink(buffer_address, f"{self.name}{CHANNEL}credit", buffer_timeout_s, secrets,
                                      buffer_client)
        self._weights_loaded = asyncio.Event()
        self.version = int(initial_version)
        self.learner_version: int | None = None
        self.luffy = algos.get(cfg.algo).guided_rows  # demonstration-guided rows (LUFFY)
        self._ratio_rng = random.Random(f"luffy/{cfg.seed}/{actor_id}")
        self._nonce = uuid.uuid4().hex[:8]  # group ids stay unique across restarts of this actor
        self._counter = 0
        self._reward_fn = reward_fn
        self.engine = self.sampler = self.outbox = self.receiver = self.adapters = None
        self._owns_engine = False
        self._credits = 0
        self._delivered: deque[tuple[float, tuple[int, int]]] = deque(maxlen=DELIVERED_KEPT)
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._run_task = self._push_task = self._follow_task = None  # asyncio.Task each, once started
        self.counts = dict.fromkeys(("groups_started", "groups_acked", "groups_failed", "samples", "credit_requests",
                                     "credit_denied", "weight_updates", "groups_no_version", "sent_tokens",
                                     "mixed_version_tokens", "groups_requeued"), 0)
        self.times = {"credit_wait_s": 0.0, "generate_s": 0.0, "weight_update_s": 0.0, "weight_pause_s": 0.0,
                      "no_version_s": 0.0}
        self._t_start = None
        self.load = None  # the engine's concurrency (`actors.occupancy.sized`), known once start() has it
        self.in_flight = InFlight()  # sequences in flight: prompts × rollout.n

    # ------------------------------------------------------------------ lifecycle
    async def start(self, engine=None) -> None:
        """Start the engine (blocking ~20 s on CPU) -- or use `engine`, a running `AsyncLLM` built
        from the same spec and owned by the caller -- and start delivering groups. The engine's
        weight-version label is set to this actor's version; a shared engine that already carries
        an integer label keeps it and the actor adopts it."""
        if self.engine is not None:
            return
        tokenizer = load_tokenizer(self.spec.model_dir, self.spec.trust_remote_code)
        self._owns_engine = engine is None
        self.engine = build_engine(self.spec) if engine is None else engine
        label = await self.engine.get_weight_version()
        if engine is not None and str(label).lstrip("-").isdigit():
            self.version = int(label)
        else:
            await self.engine.update_weight_version(str(self.version))
        self.adapters = engine_adapters(self.cfg, self.engine, self.name, self.spec.model_dir)  # LoRA pushes
        r = self.cfg.rollout
        self.sampler = GroupSampler(
            self.engine, tokenizer,
            SamplingSettings.from_config(r),
            name=self.name, reward_fn=self._reward_fn or scorer_for(self.cfg), seed=self.cfg.seed * 1000 + self.actor_id,
            salt_version=None if self.clears_cache and self.adapters is None else lambda: self.version,
            deadlines=r.deadlines, multiturn=multiturn_builder(self.cfg, tokenizer), adapters=self.adapters)
        self.outbox = Outbox(self.link, on_sent=self._on_sent)
        self._push_task = asyncio.create_task(self.outbox.run(), name=f"{self.name}-outbox")
        self.load = sized(self.cfg, self.engine, gpu=not self.spec.cpu, actors=self.num_actors)
        self.in_flight = InFlight()  # averaged from when the engine can take work
        if not self.spec.cpu:  # what prompts_in_flight chose, and whether the credit leaves the engine idle
            print(start_line(self.name, self.load), file=sys.stderr, flush=True)

    def _on_sent(self, group: Group, ack) -> None:
        self.counts["groups_acked"] += 1
        for s in group.samples:  # generated tokens only (a LUFFY prefix, an environment's tokens: version -1)
            v = s.on_policy_versions
            self.counts["sent_tokens"] += int(v.size)
            if v.size and v.min() != v.max():
                self.counts["mixed_version_tokens"] += int(v.size)
        self._delivered.append((time.time(), group.key))

    def delivered_since(self, wall_time: float) -> list[tuple[int, int]]:
        """(epoch, prompt) of the groups the buffer acknowledged at or after `wall_time` (time.time()),
        oldest first: what a buffer that died after a snapshot of that time may have lost
        (`launch.state.buffer_keeper`). The record keeps the last DELIVERED_KEPT acknowledgements."""
        return [k for t, k in self._delivered if t >= wall_time]

    async def close(self) -> None:
        await self.stop(drain=False)
        for t in (self._push_task, self._follow_task):
            if t is not None:
                t.cancel()
        if self.receiver is not None:
            try:
                await self.receiver.close()
            except Exception:
                logger.exception("%s: closing the weight receiver failed", self.name)
        for part in (self.sampler, self.adapters):  # reward/turn threads; adapters' scratch folder
            if part is not None:
                part.close()
        if self._owns_engine:
            shutdown_engine(self.engine)
        self.engine = None
        self.link.close()
        self.credit_link.close()

    # ------------------------------------------------------------------ rollouts
    async def run(self, max_groups: int | None = None) -> int:
        """Start up to `max_groups` prompts (None: until `stop()`), each once the buffer granted credit;
        return once their groups were delivered (after `stop()`: once the prompts in flight finished).
        Returns the number of prompts started. Raises if the engine died meanwhile."""
        if self.engine is None:
            raise RuntimeError(f"{self.name}: call start() before run()")
        self._stop.clear()
        self._t_start = self._t_start or time.monotonic()
        if self.load is None:  # a subclass's start() that brings no engine (bench/perf/scale.py's timer actors)
            self.load = sized(self.cfg, self.engine, gpu=not self.spec.cpu, actors=self.num_actors)
        width = self.load.prompts
        backoff = Backoff(0.05, 1.0)
        stop_waiter = asyncio.create_task(self._stop.wait())
        try:
            started = await self._admit(max_groups, width, backoff, stop_waiter)
        finally:
            stop_waiter.cancel()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._release_unused()
        if self.engine is not None and self.engine.errored:
            raise RuntimeError(f"{self.name}: the vLLM engine died; see its log above")
        if self._wedged():
            raise RuntimeError(f"{self.name}: {self._wedged()}")
        if not self._stop.is_set():
            await self.outbox.drain()
        return started

    async def _admit(self, max_groups: int | None, width: int, backoff: Backoff, stop_waiter) -> int:
        started = 0
        while not self._stop.is_set() and (max_groups is None or started < max_groups):
            if self._wedged():  # the driver replaces this actor
                break
            if len(self._tasks) >= width:
                await asyncio.wait(self._tasks | {stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
                continue
            if not self.serves_a_version:  # a push failed: nothing to sample with until a complete one
                await self._pause(0.1, "no_version_s")
                continue
            if self._credits == 0:
                want = width - len(self._tasks)
                if max_groups is not None:
                    want = min(want, max_groups - started)
                await self._ask_credit(want, backoff, stop_waiter)
                continue  # (stopped meanwhile? then the credit is released, not spent)
            self._credits -= 1
            started += 1
            self._spawn(*self.cursor.next_keyed())
        return started

    async def _ask_credit(self, want: int, backoff: Backoff, stop_waiter) -> None:
        """Wait in the buffer's queue for credit (module docstring); back off only while the buffer is
        unreachable or the actor is too far behind the learner for any credit."""
        self.counts["credit_requests"] += 1
        t0 = time.monotonic()
        try:
            credit = await self._long_poll(want, stop_waiter)
        except BufferDown as e:
            self.times["credit_wait_s"] += time.monotonic() - t0
            logger.warning("%s: %s", self.name, e)
            await self._pause(backoff.next(), "credit_wait_s")
            return
        self.times["credit_wait_s"] += time.monotonic() - t0
        self.learner_version = credit.learner_version
        self._credits += credit.granted
        if credit.granted > 0:
            backoff.reset()
            return
        self.counts["credit_denied"] += 1
        if behind(self.version, credit.learner_version, self.cfg.buffer.max_staleness):
            await self._await_weights(credit.learner_version, backoff.next())

    async def _long_poll(self, want: int, stop_waiter):
        """One credit request on the credit link, restated when newer weights load and cancelled on stop
        (the cancel is repeated until it lands: a reconnecting link may not have a client to reach)."""
        asked = self.version
        self._weights_loaded.clear()
        call = asyncio.ensure_future(self.credit_link.call("request_credit", want, asked, CREDIT_WAIT_S))
        while not call.done():
            if self._stop.is_set():
                self.credit_link.interrupt()
                await asyncio.wait({call}, timeout=0.5)
                continue
            loaded = asyncio.ensure_future(self._weights_loaded.wait())
            await asyncio.wait({call, stop_waiter, loaded}, return_when=asyncio.FIRST_COMPLETED)
            loaded.cancel()
            if self._weights_loaded.is_set():
                self._weights_loaded.clear()
                if self.version > asked and not call.done():
                    asked = self.version
                    self.credit_link.interrupt(asked)
        return call.result()

    async def _await_weights(self, learner_version: int, seconds: float) -> None:
        """Wait (at most `seconds`, or until stop) for weights recent enough for credit at learner_version."""
        t0 = time.monotonic()
        self._weights_loaded.clear()
        while behind(self.version, learner_version, self.cfg.buffer.max_staleness) and not self._stop.is_set():
            left = seconds - (time.monotonic() - t0)
            if left <= 0:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._weights_loaded.wait(), min(left, 0.1))
            self._weights_loaded.clear()
        self.times["credit_wait_s"] += time.monotonic() - t0

    def _loaded(self, version: int) -> None:
        super()._loaded(version)
        self._weights_loaded.set()  # a credit request waiting with older weights is restated

    async def _pause(self, seconds: float, timer: str) -> None:
        t0 = time.monotonic()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        self.times[timer] += time.monotonic() - t0

    async def _release_unused(self) -> None:
        n, self._credits = self._credits, 0
        if n > 0:
            try:
                await self.credit_link.call("release_credit", n)
            except BufferDown as e:  # a restarted buffer holds no credit of ours anyway
                logger.warning("%s: could not release %d credits: %s", self.name, n, e)

    def _spawn(self, item: PromptItem, epoch: int = 0) -> None:
        task = asyncio.create_task(self._rollout(item, epoch), name=f"{self.name}-p{item.prompt_index}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        self.in_flight.set(len(self._tasks) * self.cfg.rollout.n)
        self.counts["groups_started"] += 1

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self.in_flight.set(len(self._tasks) * self.cfg.rollout.n)

    async def _rollout(self, item: PromptItem, epoch: int = 0) -> None:
        t0 = time.monotonic()
        try:
            group = await self.make_group(item, epoch)
        except asyncio.CancelledError:
            self._credits += 1  # released by run()'s epilogue
            raise
        except (GroupDropped, NoVersionError) as e:  # nothing delivered, the prompt goes back into the shard:
            # stalled past its retries, or sampled (in part) after a failed push (never trained)
            kind = "groups_requeued" if isinstance(e, GroupDropped) else "groups_no_version"
            logger.warning("%s: group of prompt %d dropped, the prompt re-queued: %s", self.name, item.prompt_index, e)
            self.cursor.requeue([(epoch, item.prompt_index)])
            self.counts[kind] += 1
            self._credits += 1
            return
        except Exception:  # not re-queued: a failure of the prompt itself would come back every time
            logger.exception("%s: rollout of prompt %d failed", self.name, item.prompt_index)
            self.counts["groups_failed"] += 1
            self._credits += 1
            if self.engine is not None and self.engine.errored:
                self._stop.set()
            return
        self.times["generate_s"] += time.monotonic() - t0
        self.counts["samples"] += group.n
        self.outbox.put(group)

    async def make_group(self, item: PromptItem, epoch: int = 0) -> Group:
        """Sample, score and package one prompt's group (LUFFY rows included); `epoch`: its pass over the shard."""
        n = self.cfg.rollout.n
        luffy = self.luffy and item.demo_ids is not None  # else on-policy rows (a live teacher's trace is pending)
        plan = plan_group(self.cfg.luffy, n, self.version, self._ratio_rng) if luffy else plain_group_plan(n)
        if self.sampler.multiturn is None:
            (samples, ratios), prompt = await self.sampler.sample_group(item, plan), item.prompt_ids
        else:  # multi-turn rollouts (envs/): an environment's reset may set the prompt
            (samples, prompt), ratios = await self.sampler.sample_turns(item, n), []
        meta: dict = {"epoch": epoch}
        if self.luffy:
            meta.update(prefix_ratios=ratios, demo_rows=plan.demo_rows)
        self._counter += 1
        return Group(group_id=f"a{self.actor_id}-{self._nonce}-{self._counter:07d}", prompt_index=item.prompt_index,
                     prompt_tokens=np.asarray(prompt, dtype=np.int32), samples=samples,
                     ground_truth=item.ground_truth, data_source=item.data_source, actor_id=self.actor_id,
                     meta=meta)

    async def stop(self, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop starting prompts. drain=True: finish the prompts in flight and deliver every group;
        drain=False: abort them (their credit is released) and keep undelivered groups queued."""
        self._stop.set()
        if not drain:
            for t in list(self._tasks):
                t.cancel()
        if self._run_task is not None:
            await asyncio.gather(self._run_task, return_exceptions=True)
            self._run_task = None
        elif self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
            await self._release_unused()
        if drain and self.outbox is not None:
            await self.outbox.drain(timeout_s)

    def start_background(self, max_groups: int | None = None) -> None:
        """`run()` as a background task on the current loop (orchestrator mode)."""
        if self._run_task is not None and not self._run_task.done():
            raise RuntimeError(f"{self.name}: rollouts already running")
        self._run_task = asyncio.create_task(self.run(max_groups), name=f"{self.name}-run")

    # ------------------------------------------------------------------ evaluation / metrics
    async def evaluate(self, items: list[PromptItem], temperature: float | None = None) -> dict:
        if self.engine is None:
            raise RuntimeError(f"{self.name}: call start() before evaluate()")
        return {**await self.sampler.evaluate(items, temperature), "version": self.version}

    def stats(self) -> dict:
        elapsed = time.monotonic() - self._t_start if self._t_start else 0.0
        gen = self.sampler.generated_tokens if self.sampler else 0
        ob = self.outbox
        delivery = ({"outbox": len(ob), "sent": ob.sent, "resent": ob.resent, "rejected": dict(ob.rejected),
                     "buffer_down_s": ob.down_s, "push_s": ob.push_s} if ob is not None else {})
        return {"actor_id": self.actor_id, "version": self.version, "learner_version": self.learner_version,
                **self.counts, **self.times, **(self.sampler.times if self.sampler else {}), "generated_tokens": gen, "elapsed_s": elapsed,
                **(self.sampler.reward_stats() if self.sampler else {}),  # reward_errors, reward_timeouts
                **(self.sampler.deadline_stats() | self.sampler.env_stats() if self.sampler else {}),  # env_*: envs/
                "tokens_per_s": gen / elapsed if elapsed else 0.0, "in_flight": len(self._tasks),
                "prompts_in_flight": self.load.prompts if self.load else None, "seqs_in_flight": self.in_flight.mean(),
                "seq_capacity": self.load.capacity if self.load else None,
                "serves_a_version": self.serves_a_version,
                "credits_held": self._credits, **delivery,
                "reconnects": self.link.reconnects + self.credit_link.reconnects,
                "pid": os.getpid(),
                # truthy = replace me (the driver's health check): vLLM's engine died, or why it is wedged
                "engine_dead": bool(self.engine is not None and self.engine.errored) or self._wedged() or False}

    def _wedged(self) -> str | None:
        return self.sampler.wedged if self.sampler is not None else None
