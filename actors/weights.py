"""Weight updates of a running actor, through `weightsync.receiver.WeightReceiver`.

Why a receiver and not our own loading code: the transfer (learner -> vLLM worker over gloo/NCCL,
bucketed, with deadlines) and the engine choreography (``pause_generation(mode="keep")`` ->
``start_weight_update`` / ``update_weights`` / ``finish_weight_update(version)`` ->
``resume_generation`` in ``finally``) belong to `weightsync`. The actor only decides *when* to apply
a push and keeps its own version in step: `finish_weight_update` relabels the engine, so tokens
sampled after the resume carry the new version (`actors.rows`), and the next credit request states it.

Two ways to drive it (both after `connect_weight_sync(host, port, token)`):
  - `apply_weight_update(timeout_s)`: the orchestrator calls it when the learner announces a version
    (concurrently with the learner's `WeightSender.push`, which blocks until every actor acknowledged);
  - `follow_weight_updates()`: a background task applies every push as it is announced.
"""

from __future__ import annotations

import asyncio
import time

from actors.deadlines import pausing


class WeightUpdates:
    """Mixin of `actors.core.AsyncActor` (uses its engine, name, version, counts, times)."""

    receiver = None
    adapters = None  # actors.adapters.AdapterPins of a LoRA run whose pushes are adapters
    _follow_task: asyncio.Task | None = None

    async def connect_weight_sync(self, host: str, port: int, token: str) -> int:
        """Join the learner's weight-sync group (`weightsync.WeightSender` at host:port), proving `token`
        (the run's `RunSecrets.weight_sync_token`; a wrong one is refused); returns the rank.
        Joining a new group (the learner rebuilt it, e.g. after an actor crashed) first stops following
        the old one (`follow_weight_updates` must be called again)."""
        from weightsync.receiver import WeightReceiver

        old, self._follow_task = self._follow_task, None
        if old is not None:
            if not old.done():
                old.cancel()
                await asyncio.wait([old])
            if not old.cancelled():
                old.exception()  # the old group's end (its store closed) is expected: mark it retrieved

        label = await self.engine.get_weight_version()  # NO_VERSION after a failed push: still none
        serving = self.version if str(label).lstrip("-").isdigit() else None
        clock = getattr(getattr(self, "sampler", None), "clock", None)  # a push's pause stops the deadlines' clock
        self.receiver = WeightReceiver(pausing(self.engine, clock), host, port, token=token, name=self.name,
                                       initial_version=serving, clear_cache=self.clears_cache,
                                       on_update=self._loaded, adapters=self.adapters)
        return await self.receiver.init()

    @property
    def clears_cache(self) -> bool:
        """`weight_sync.clear_cache` for this actor's engine (auto: true on CPU, false on GPUs)."""
        return self.cfg.weight_sync.resolved_clear_cache(gpu=not self.spec.cpu)

    @property
    def serves_a_version(self) -> bool:
        """False from a failed or aborted push until the next complete one (the engine is labelled
        `weightsync.receiver.NO_VERSION`): the actor starts no prompt meanwhile."""
        return getattr(self.receiver, "version", 0) is not None  # (stand-ins without one: bench/perf/scale.py)

    def _loaded(self, version: int) -> None:
        """Called by the receiver once the engine serves `version` (generation already resumed)."""
        self.version = int(version)
        self.counts["weight_updates"] += 1
        if self.receiver.last_pause is not None:
            paused_at, resumed_at = self.receiver.last_pause
            self.times["weight_pause_s"] += resumed_at - paused_at

    async def apply_weight_update(self, timeout_s: float | None = None) -> int | None:
        """Wait for the learner's next announced push and load it into the running engine (pause keep
        -> load -> resume, by `WeightReceiver.sync_once`). Returns the new version, or None when no
        push was announced within `timeout_s`. Tokens generated after it carry the new version."""
        if self.receiver is None:
            raise RuntimeError(f"{self.name}: apply_weight_update() before connect_weight_sync()")
        if self._follow_task is not None and not self._follow_task.done():
            raise RuntimeError(f"{self.name}: follow_weight_updates() is applying pushes already")
        t0 = time.monotonic()
        v = await self.receiver.sync_once(timeout_s)
        if v is not None:
            self.times["weight_update_s"] += time.monotonic() - t0
        return v

    async def follow_weight_updates(self) -> None:
        """Apply every announced push as it comes (a background `WeightReceiver.run`), instead of
        explicit `apply_weight_update` calls."""
        if self.receiver is None:
            raise RuntimeError(f"{self.name}: follow_weight_updates() before connect_weight_sync()")
        if self._follow_task is None or self._follow_task.done():
            self._follow_task = asyncio.create_task(self.receiver.run(), name=f"{self.name}-weights")
