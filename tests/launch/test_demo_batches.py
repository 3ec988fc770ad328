"""The one SFT batcher (`launch.prep.demo_batches`), shared by the driver's SFT runs and the tiny model's
warm-up: seeded epochs read front to back, a batch completed across an epoch's end, the epoch carried."""

from __future__ import annotations

import random

import numpy as np
import pytest

from launch.prep.demo_batches import DemoBatches


def _warmup_order_before(keys: list[int], per_step: int, seed: int, steps: int) -> list[list[int]]:
    """The warm-up's own loop before it used DemoBatches (the cached warm models were trained in this
    order, so the shared batcher must keep it)."""
    rng, order, batches = random.Random(seed), [], []
    for _ in range(steps):
        if len(order) < per_step:
            more = keys[:]
            rng.shuffle(more)
            order += more
        batch, order = order[:per_step], order[per_step:]
        batches.append(batch)
    return batches


def test_the_order_is_the_warmups_and_a_batch_spans_an_epochs_end():
    demos = {i: np.array([1, 2, i], np.int32) for i in (4, 0, 3, 1, 2)}
    prompts = {i: (9, i) for i in demos}
    b = DemoBatches(demos, prompts, per_step=2, seed=7)
    got = [b.next() for _ in range(6)]  # 12 groups: epochs 0 and 1 (5 each) and 2 of epoch 2
    assert [[g.prompt_index for g in batch] for batch in got] == _warmup_order_before(sorted(demos), 2, 7, 6)
    flat = [g for batch in got for g in batch]
    assert [g.meta["epoch"] for g in flat] == [0] * 5 + [1] * 5 + [2] * 2
    assert sorted(g.prompt_index for g in flat[:5]) == [0, 1, 2, 3, 4]  # an epoch draws each once
    g = flat[0]
    assert g.prompt_tokens.tolist() == [9, g.prompt_index] and g.samples[0].tokens.tolist() == [1, 2, g.prompt_index]
    assert g.samples[0].finish_reason == "demo"


def test_a_demonstration_without_a_prompt_is_never_drawn():
    b = DemoBatches({0: np.array([1]), 1: np.array([2])}, {1: (5,)}, per_step=3, seed=0)
    assert [g.prompt_index for g in b.next()] == [1, 1, 1]
    with pytest.raises(ValueError, match="no demonstration has a prompt"):
        DemoBatches({0: np.array([1])}, {}, per_step=1, seed=0)
