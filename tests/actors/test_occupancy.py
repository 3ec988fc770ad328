"""How busy an actor keeps its engine (`actors.occupancy`), without an engine: the time average of the
sequences in flight, the concurrency sized from what a started engine reports, and the start line."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from actors.occupancy import InFlight, max_num_seqs, sized, start_line
from configs.loading import resolve


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_time_average_of_a_count_that_changes_in_steps():
    clock = Clock()
    flying = InFlight(tau_s=30.0, clock=clock)
    assert flying.mean() == 0.0  # no time has passed
    flying.set(10)
    clock.t = 30.0
    assert flying.mean() == pytest.approx(10.0)  # 10 all the time since the start, whatever the weights
    flying.set(0)
    clock.t = 60.0
    # 10 over [0, 30] and 0 over [30, 60], weighted exp(-age / 30): 10 (e^-1 − e^-2) / (1 − e^-2) = 10 / (1 + e)
    assert flying.mean() == pytest.approx(10 / (1 + math.e))


def engine(blocks: int, block_size: int = 16, seqs: int | None = 1024):
    return SimpleNamespace(vllm_config=SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=blocks,
                                                                                    block_size=block_size),
                                                       scheduler_config=SimpleNamespace(max_num_seqs=seqs)))


def test_auto_takes_the_engines_own_figures():
    cfg = resolve("pure", flags={"model.path": "/models/q", "rollout.num_actors": 8},
                  overrides=["learner.batch_prompts=64", "rollout.n=8"])
    # a 7B on an H100 at 0.85: 57,303 blocks × 16 = 916,848 KV tokens = 223 sequences of 1,024 + 3,072 tokens
    load = sized(cfg, engine(57_303), gpu=True, actors=8)
    assert (load.capacity, load.prompts) == (223, 27)  # 223 // 8 = 27 prompts, under the credit share of 32
    assert max_num_seqs(engine(1, seqs=128)) == 128 and max_num_seqs(SimpleNamespace()) is None
    # vLLM's default scheduler (128 sequences at once) would hold it to 128 // 8 = 16 prompts
    assert sized(cfg, engine(57_303, seqs=128), gpu=True, actors=8).prompts == 16
    assert sized(cfg, engine(57_303), gpu=False, actors=8).prompts == 16  # CPU: today's value
    assert start_line("actor-3", load) == ("[engine] actor-3: 27 prompts × 8 in flight at most "
                                           "(rollout.prompts_in_flight auto; credit share 32 of W = 256 groups over 8 "
                                           "actors), of the 223 sequences its engine holds")


def test_the_start_line_says_when_the_engine_is_mostly_idle():
    cfg = resolve("pure", flags={"model.path": "/models/q", "rollout.num_actors": 8})  # batch 16, n 4: W = 80
    line = start_line("actor-0", sized(cfg, engine(57_303), gpu=True, actors=8))
    assert line.startswith("[engine] actor-0: 10 prompts × 4 in flight at most")
    assert "— engines mostly idle: each engine keeps at most 10 prompts × 4 = 40 sequences in flight, 18% of the 223" \
        in line and line.endswith("(each engine then keeps ≥ 28 prompts in flight)")
