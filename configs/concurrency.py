"""How many prompts an actor keeps in flight (`rollout.prompts_in_flight`), what `auto` decides, and when
the run's credit leaves its engines mostly idle.

Why size it: a vLLM engine batches every running sequence into one forward pass per decode step. On a GPU
that step reads all the weights whatever the batch (decoding is memory-bound), so an engine given a few
dozen sequences spends most of its time idle. What an engine can hold at once is its KV cache: the
tokens it reports once started (`actors.engine.kv_cache_tokens`) over the tokens of one sequence at full
length (data.max_prompt_tokens + rollout.max_response_tokens), and never more than its scheduler runs at
once (vLLM's max_num_seqs). What an actor may hold is its share of the staleness credit: the buffer lets
at most W = min((K + 1) × learner.batch_prompts, buffer.capacity_groups) groups be stored or in flight
(`buffer.admission`), split fairly among the actors that wait for it, so ceil(W / actors) each, with K
the largest bound of the run (buffer.max_staleness_cap under max_staleness_auto, which only raises K).

    auto on a GPU engine:  max(1, min(holds // rollout.n, ceil(W / actors)))   prompts
    auto on CPU:           16 prompts (CPU_PROMPTS_IN_FLIGHT)

A CPU engine is bound by its cores, not its cache: one engine with 16 prompts of 8 samples made more
samples per engine CPU-second than two engines with 8 each (bench/RESULTS.md "One engine or two"), the
layout the algorithm YAMLs state, so `auto` there is that value and the quick-start stays as it was.

Mostly idle: an engine whose actor keeps fewer than IDLE_SHARE of the sequences the engine holds (GPU
engines only). `EngineLoad.warning` says so with the fix: `rollout.prompts_in_flight=auto` when a fixed
value is the limit, else a batch (or a staleness cap) that raises W, or fewer actors sharing it.
Pure arithmetic, torch-free: the planner, `algo-train doctor` and each actor call the same functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CPU_PROMPTS_IN_FLIGHT = 16  # auto on a CPU engine (module docstring)
IDLE_SHARE = 0.5  # an engine holding fewer than this share of what its KV cache can hold is "mostly idle"


def largest_staleness(cfg) -> int:
    """The largest K the run may reach: max_staleness_cap under max_staleness_auto, else max_staleness."""
    b = cfg.buffer
    return max(b.max_staleness, b.max_staleness_cap) if b.max_staleness_auto else b.max_staleness


def credit_window(cfg) -> int:
    """W: the most groups the buffer lets be stored or in flight at once (module docstring)."""
    return min((largest_staleness(cfg) + 1) * cfg.learner.batch_prompts, cfg.buffer.capacity_groups)


def credit_share(cfg, actors: int) -> int:
    """Prompts one of `actors` actors may hold in flight when all of them want more: ceil(W / actors)."""
    return math.ceil(credit_window(cfg) / max(1, actors))


def engine_sequences(kv_tokens: int | None, seq_tokens: int, max_num_seqs: int | None) -> int | None:
    """Sequences an engine holds at once at full length: its KV tokens // tokens per sequence, at most its
    max_num_seqs; None when the engine did not say how many KV tokens it has."""
    if kv_tokens is None:
        return None
    held = kv_tokens // seq_tokens
    return min(held, max_num_seqs) if max_num_seqs else held


@dataclass(frozen=True)
class EngineLoad:
    """One engine's concurrency: the prompts its actor keeps in flight, what the engine holds, and why."""

    prompts: int  # prompts in flight (the resolved rollout.prompts_in_flight)
    n: int  # sequences per prompt (rollout.n)
    capacity: int | None  # sequences the engine holds at full length (None: not known)
    setting: int | str  # rollout.prompts_in_flight as configured (a number or "auto")
    window: int  # W, groups (credit_window)
    actors: int
    staleness: int  # K of the window (largest_staleness)
    batch_prompts: int
    capacity_groups: int
    gpu: bool

    @property
    def share(self) -> int:
        return math.ceil(self.window / max(1, self.actors))

    def held(self) -> int:
        """Prompts the actor keeps in flight while every actor wants credit: its width, at most its share."""
        return min(self.prompts, self.share)

    def busy(self) -> float | None:
        """Sequences in flight at most, as a share of what the engine holds (None: capacity not known)."""
        return self.held() * self.n / self.capacity if self.capacity else None

    def warning(self) -> tuple[str, str] | None:
        """(what was found, the fix) when a GPU engine is mostly idle (module docstring); else None."""
        busy = self.busy()
        if not self.gpu or busy is None or busy >= IDLE_SHARE:
            return None
        need = math.ceil(IDLE_SHARE * self.capacity / self.n)  # prompts per engine for half its capacity
        found = (f"each engine keeps at most {self.held()} prompts × {self.n} = {self.held() * self.n} sequences "
                 f"in flight, {busy:.0%} of the {self.capacity} it holds")
        if self.setting != "auto" and self.setting < self.share:
            return (f"{found} (rollout.prompts_in_flight={self.setting})",
                    f"set rollout.prompts_in_flight=auto (up to {min(self.share, self.capacity // self.n)} here)")
        k = self.staleness
        found += (f": the staleness credit W = min(({k} + 1) × learner.batch_prompts {self.batch_prompts}, "
                  f"buffer.capacity_groups {self.capacity_groups}) = {self.window} groups, shared by {self.actors} "
                  f"actors, gives each {self.share}")
        groups = self.actors * need  # W that gives every actor `need`; at least one of the two below falls short
        batch, room = math.ceil(groups / (k + 1)), f"buffer.capacity_groups to {groups}"
        if batch > self.batch_prompts:
            fixes = [f"raise learner.batch_prompts to {batch}" + (f" and {room}" if groups > self.capacity_groups else "")]
        else:
            fixes = [f"raise {room}"]
        if self.actors > 1 and (fewer := self.window // need) < self.actors:
            fixes.append(f"run {max(1, fewer)} actors (--actors {max(1, fewer)})")
        return found, " or ".join(fixes) + f" (each engine then keeps ≥ {need} prompts in flight)"


def engine_load(cfg, *, gpu: bool, actors: int, kv_tokens: int | None = None,
                max_num_seqs: int | None = None) -> EngineLoad:
    """The concurrency of one engine of `cfg` among `actors` actors: `rollout.prompts_in_flight`, or what
    auto decides (module docstring) from the KV tokens and max_num_seqs the engine reports (or an estimate)."""
    r = cfg.rollout
    seq_tokens = cfg.data.max_prompt_tokens + r.max_response_tokens
    capacity = engine_sequences(kv_tokens, seq_tokens, max_num_seqs)
    share = credit_share(cfg, actors)
    if r.prompts_in_flight != "auto":
        prompts = r.prompts_in_flight
    elif not gpu:
        prompts = CPU_PROMPTS_IN_FLIGHT
    else:
        prompts = max(1, min(capacity // r.n, share)) if capacity is not None else share
    return EngineLoad(prompts=prompts, n=r.n, capacity=capacity, setting=r.prompts_in_flight,
                      window=credit_window(cfg), actors=actors, staleness=largest_staleness(cfg),
                      batch_prompts=cfg.learner.batch_prompts, capacity_groups=cfg.buffer.capacity_groups, gpu=gpu)
