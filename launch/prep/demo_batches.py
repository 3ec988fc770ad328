"""Demonstrations as training batches (SFT): the one batcher of the driver's SFT runs and of the tiny
model's warm-up (`launch.prep.model_prep.run_sft`).

Order: epochs over the demonstrations with a prompt, each epoch a `random.Random(seed)` shuffle of
the sorted prompt indices, read front to back; a batch that reaches the end of an epoch is completed
from the next one. Each group carries the epoch it was drawn in (`meta["epoch"]`: the prompt ledger's
key is (epoch, prompt index)).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import numpy as np

from buffer.records import DEMO_VERSION, Group, Sample


def demo_group(prompt_ids, demo_ids: np.ndarray, index: int, env: np.ndarray | None = None) -> Group:
    """A one-row group whose response is a demonstration (SFT trains on it; no behaviour policy). `env`: bool per
    token, True on environment tokens (a multi-turn demonstration's tool results, as a rollout appends them):
    no loss on them, and they are not demonstration tokens either."""
    t = len(demo_ids)
    env = np.zeros(t, bool) if env is None else np.asarray(env, bool)
    sample = Sample(tokens=np.asarray(demo_ids, dtype=np.int32), logprobs=np.zeros(t, np.float32),
                    versions=np.full(t, DEMO_VERSION, np.int32), prefix_mask=~env, reward=1.0,
                    finish_reason="demo", env_mask=env)
    return Group(group_id=f"demo-{index}", prompt_index=index, prompt_tokens=np.asarray(prompt_ids, np.int32),
                 samples=[sample])


class DemoBatches:
    """`next()`: the next `per_step` demonstration groups, in the order of the module docstring.

    demos: {prompt index: demonstration token ids}; prompts: {prompt index: prompt token ids} (a
    demonstration whose prompt is missing is never drawn); env: {prompt index: environment-token mask} of the
    multi-turn demonstrations (`demo_group`), the others have none."""

    def __init__(self, demos: Mapping[int, np.ndarray], prompts: Mapping[int, Sequence[int]], per_step: int,
                 seed: int, env: Mapping[int, np.ndarray] | None = None):
        self.demos, self.prompts, self.per_step, self.env = demos, prompts, per_step, env or {}
        self.rng = random.Random(seed)
        self.keys = sorted(k for k in demos if k in prompts)
        if not self.keys:
            raise ValueError("no demonstration has a prompt to train on")
        self.epoch, self.order = -1, []

    def next(self) -> list[Group]:
        batch = []
        while len(batch) < self.per_step:
            if not self.order:
                self.epoch += 1
                self.order = self.keys[:]
                self.rng.shuffle(self.order)
                self.order.reverse()  # pop() then reads the shuffle front to back
            i = self.order.pop()
            g = demo_group(self.prompts[i], self.demos[i], i, self.env.get(i))
            g.meta["epoch"] = self.epoch
            batch.append(g)
        return batch
