"""How busy an actor keeps its engine: the prompts it keeps in flight (`rollout.prompts_in_flight`, `auto`
sized from what the started engine reports: `configs.concurrency`), and the sequences in flight over time
against what the engine holds (the stats behind the metrics actors/seqs_in_flight and actors/seq_capacity).

Why a time average and not the count at the moment stats are read: an actor's in-flight count swings
between its credit share and 0 (groups finish, the credit is spent, new credit waits for the learner), so
one reading every few seconds says little. `InFlight` keeps an exponentially weighted average of the
count over the last ~TAU_S seconds (exact for a count that changes in steps, normalised for the time since
it started), which any number of readers can read.
"""

from __future__ import annotations

import math
import time

from actors.engine import kv_cache_tokens
from configs.concurrency import EngineLoad, engine_load

TAU_S = 30.0  # seconds: the time constant of the average in flight


class InFlight:
    """A count that changes in steps (`set`) and its exponentially weighted time average (`mean`)."""

    def __init__(self, tau_s: float = TAU_S, clock=time.monotonic):
        self.tau_s, self.clock = tau_s, clock
        self.start = self.at = clock()
        self.level, self.avg = 0, 0.0  # the count since `at`; the (unnormalised) average up to `at`

    def _decayed(self, now: float) -> float:
        return self.level + (self.avg - self.level) * math.exp(-(now - self.at) / self.tau_s)

    def set(self, count: int) -> None:
        now = self.clock()
        self.avg, self.at, self.level = self._decayed(now), now, count

    def mean(self) -> float:
        """The average count over the last ~tau_s seconds (weights exp(-age / tau_s)); 0 before any time passed."""
        now = self.clock()
        weight = 1.0 - math.exp(-(now - self.start) / self.tau_s)  # the weights' total since the start
        return self._decayed(now) / weight if weight > 0 else 0.0


def max_num_seqs(engine) -> int | None:
    """Sequences a started vLLM 0.32 engine schedules at once (`vllm_config.scheduler_config.max_num_seqs`)."""
    sched = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
    value = getattr(sched, "max_num_seqs", None)
    return int(value) if value else None


def sized(cfg, engine, gpu: bool, actors: int) -> EngineLoad:
    """The concurrency of this actor's started engine (`configs.concurrency.engine_load` with what it reports)."""
    return engine_load(cfg, gpu=gpu, actors=actors, kv_tokens=kv_cache_tokens(engine), max_num_seqs=max_num_seqs(engine))


def start_line(name: str, load: EngineLoad) -> str:
    """What a GPU actor says once its engine is up: the prompts it keeps in flight, why, and whether the run's
    credit leaves the engine mostly idle (with the fix)."""
    held = ("its KV cache holding an unknown number of sequences" if load.capacity is None
            else f"of the {load.capacity} sequences its engine holds")
    line = (f"[engine] {name}: {load.prompts} prompts × {load.n} in flight at most (rollout.prompts_in_flight "
            f"{load.setting}; credit share {load.share} of W = {load.window} groups over {load.actors} actors), {held}")
    said = load.warning()
    return f"{line} — engines mostly idle: {said[0]} — {said[1]}" if said else line
