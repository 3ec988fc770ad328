"""Builders and comparisons shared by the buffer tests."""

from __future__ import annotations

import asyncio

import numpy as np

from buffer.records import Group, Sample
from buffer.settings import BufferSettings
from buffer.wire import encode_group, parse_group


def make_group(gid: str, n: int = 4, tokens: int = 16, version: int = 0, rewards=None, prompt_index: int = 3,
               seed: int = 0, prefix: int = 0, meta: dict | None = None) -> Group:
    """A group of n samples; the first `prefix` tokens of each sample are demonstration tokens."""
    rng = np.random.default_rng(seed)
    rewards = [float(i % 2) for i in range(n)] if rewards is None else rewards
    samples = []
    for i in range(n):
        t = tokens + i  # ragged lengths
        mask = np.zeros(t, bool)
        mask[:prefix] = True
        versions = np.where(mask, -1, version + (np.arange(t) % 2)).astype(np.int32)  # some tokens newer
        lp = (-rng.random(t) * 5).astype(np.float32)
        lp[mask] = 0.0
        samples.append(Sample(tokens=rng.integers(0, 50000, t).astype(np.int32), logprobs=lp, versions=versions,
                              prefix_mask=mask, reward=float(rewards[i]), finish_reason=("stop", "length")[i % 2],
                              truncated=bool(i % 2)))
    return Group(group_id=gid, prompt_index=prompt_index, prompt_tokens=rng.integers(0, 50000, 7).astype(np.int32),
                 samples=samples, ground_truth="17", data_source="synthetic", actor_id=1,
                 meta=dict(meta or {"note": "x", "ratios": [0.5, 1.0]}))


def assert_same_group(a: Group, b: Group) -> None:
    """Exact equality of every field (arrays bit-for-bit, dtypes included)."""
    assert (a.group_id, a.prompt_index, a.ground_truth, a.data_source, a.actor_id, a.meta) == \
        (b.group_id, b.prompt_index, b.ground_truth, b.data_source, b.actor_id, b.meta)
    assert a.prompt_tokens.dtype == b.prompt_tokens.dtype and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert a.n == b.n
    for x, y in zip(a.samples, b.samples):
        for f in ("tokens", "logprobs", "versions", "prefix_mask", "env_mask"):
            u, v = getattr(x, f), getattr(y, f)
            assert u.dtype == v.dtype and u.shape == v.shape, f
            assert u.tobytes() == v.tobytes(), f  # bit-exact (also for float32 log-probs)
        assert (x.reward, x.finish_reason, x.truncated) == (y.reward, y.finish_reason, y.truncated)


def wire(g: Group):
    """The validated WireGroup the service would hold for `g`."""
    return parse_group([bytes(memoryview(f)) for f in encode_group(g)], BufferSettings().limits)


def edit_field(frames: list[bytes], field: str, fn) -> list[bytes]:
    """Apply `fn` to one array inside a group unit's data frame (located through the header)."""
    import msgpack

    from buffer.wire_group import FIELDS

    h = msgpack.unpackb(frames[0])
    data, o = bytearray(frames[1]), 0
    for f in FIELDS:
        dt, n = np.dtype(h["arrays"][f]["dtype"]), h["arrays"][f]["shape"][0]
        if f == field:
            a = fn(np.frombuffer(bytes(data[o:o + n * dt.itemsize]), dt).copy())
            data[o:o + n * dt.itemsize] = np.asarray(a, dt).tobytes()
        o += n * dt.itemsize
    return [frames[0], bytes(data), *frames[2:]]


def call_blocking(link, name: str, *args):
    """`await link.call(name, *args)` of an `actors.link.BufferLink`, from synchronous test code."""
    return asyncio.run(link.call(name, *args))
