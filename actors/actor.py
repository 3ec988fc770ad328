"""`RolloutActor`: the synchronous, orchestrator-facing actor (in-process, or wrapped as a Ray actor).

Why a private event loop thread: `AsyncLLM` needs a running asyncio loop for its output handler,
and the actor must keep generating while its caller does something else (the serial-mode learner
steps, a Ray method call returns). So the actor lives on an `actors.host.EngineHost` loop thread;
every public method submits a coroutine to it and waits for the result. The methods are
thread-safe, so a Ray wrapper may run them concurrently (`max_concurrency >= 2`, so `apply_weight_update` can run while
`run` blocks). No Ray import here: the wrapper is the orchestrator's (e.g. `ray.remote(RolloutActor)`).

Orchestrator usage::

    actor = RolloutActor(cfg, actor_id=i, model_dir=d, buffer_address=addr, prompts=train_items)
    actor.start()                               # engine up (~20 s on CPU)
    actor.connect_weight_sync(host, port, token)  # join the learner's WeightSender (weightsync)
    actor.start_rollouts()                      # background: credit -> sample -> score -> push
    ...  learner announces version v:  actor.apply_weight_update()   (concurrently with sender.push)
         or once:                       actor.follow_weight_updates() (applies every push itself)
    actor.evaluate(eval_items)                  # {"accuracy", "n", "version"}
    actor.stats(); actor.stop(); actor.close()

`prompts` is the whole training set as `actors.prompts.PromptItem`s (`items_from_records` turns
`tasks` records into them); the actor keeps its own shard (`actor_id::num_actors`). Where a
restarted actor resumes is not its own to report: the driver's ledger says (`launch.state.ledger`).
"""

from __future__ import annotations

import asyncio

from actors.core import AsyncActor
from actors.host import EngineHost
from actors.prompts import PromptItem


class RolloutActor:
    """Synchronous facade over `actors.core.AsyncActor` (same keyword arguments, plus `host`).

    host: an `actors.host.EngineHost` whose engine this actor uses (shared, not shut down by
    `close`); None = the actor makes its own host and engine in `start()`.
    """

    def __init__(self, cfg, actor_id: int, model_dir: str, buffer_address: str, prompts: list[PromptItem],
                 host: EngineHost | None = None, **kwargs):
        self._own_host = host is None
        self.host = host or EngineHost(name=f"actor-{actor_id}")
        self._closed = False

        async def make() -> AsyncActor:  # built on the loop so its asyncio objects belong to it
            return AsyncActor(cfg, actor_id, model_dir, buffer_address, prompts, **kwargs)

        self.core: AsyncActor = self._call(make())

    def _call(self, coro, timeout_s: float | None = None):
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self.core.name}: actor is closed")
        return self.host.call(coro, timeout_s)

    # -- lifecycle
    def start(self) -> None:
        """Start (or attach to the host's) engine and the group delivery task."""
        self._call(self.core.start(None if self._own_host else self.host.engine))

    def close(self) -> None:
        """Abort what is in flight, release unused credit, and (if it owns it) shut the engine down."""
        if self._closed:
            return
        try:
            self._call(self.core.close(), timeout_s=120)
        finally:
            self._closed = True
            if self._own_host:
                self.host.close()

    def __enter__(self) -> RolloutActor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- rollouts
    def run(self, max_groups: int | None = None) -> int:
        """Blocking: start `max_groups` prompts (None: until `stop`), return once their groups were
        delivered. Returns the number of prompts started."""
        return self._call(self.core.run(max_groups))

    def start_rollouts(self, max_groups: int | None = None) -> None:
        """Non-blocking `run` (the orchestrator's mode)."""
        async def go():
            self.core.start_background(max_groups)

        self._call(go())

    def stop(self, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop starting prompts; drain=True finishes those in flight and delivers their groups."""
        self._call(self.core.stop(drain, timeout_s))

    # -- weights
    def connect_weight_sync(self, host: str, port: int, token: str) -> int:
        """Join the learner's weight-sync group, proving `token` (see `AsyncActor.connect_weight_sync`)."""
        return self._call(self.core.connect_weight_sync(host, port, token))

    def apply_weight_update(self, timeout_s: float | None = None) -> int | None:
        """Load the learner's next announced weight push (see `AsyncActor.apply_weight_update`)."""
        return self._call(self.core.apply_weight_update(timeout_s))

    def follow_weight_updates(self) -> None:
        self._call(self.core.follow_weight_updates())

    @property
    def version(self) -> int:
        return self.core.version

    # -- evaluation / metrics
    def evaluate(self, items: list[PromptItem], temperature: float | None = None) -> dict:
        return self._call(self.core.evaluate(items, temperature))

    def engine_answers(self, timeout_s: float = 10.0) -> bool:
        """Whether the engine-core process answers a call (vLLM's `is_paused`, a round trip to it) within
        `timeout_s`. The driver asks when a weight push failed naming no receiver: on the gloo plane a stopped
        engine core times every receiver's broadcast out, and the one that does not answer is the cause."""
        async def ask() -> bool:
            try:
                await asyncio.wait_for(self.core.engine.is_paused(), timeout_s)
                return True
            except asyncio.TimeoutError:
                return False

        return self._call(ask())

    def stats(self) -> dict:
        async def get():
            return self.core.stats()

        return self._call(get())

    def delivered_since(self, wall_time: float) -> list[tuple[int, int]]:
        async def get():
            return self.core.delivered_since(wall_time)

        return self._call(get())

    def set_demos(self, demos: dict) -> None:
        """Demonstrations that arrived during the run ({prompt index: ids + eos}): this shard's prompts take them
        (`actors.prompts.PromptCursor.set_demos`)."""
        async def put():
            self.core.cursor.set_demos(demos)

        self._call(put())

    def requeue(self, keys: list) -> None:
        """Generate these (epoch, prompt) pairs of this actor's shard next (prompts a dead buffer lost)."""
        async def put():
            self.core.cursor.requeue(keys)

        self._call(put())
