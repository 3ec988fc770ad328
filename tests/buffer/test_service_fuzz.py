"""Fuzzing the running service with malformed and hostile messages over a raw DEALER socket.

The service must answer every message (never hang), never crash, count each rejection by reason, and
serve the groups it accepted before the fuzz bit for bit afterwards.
"""

from __future__ import annotations

import math

import msgpack
import numpy as np
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buffer.wire import SCHEMA_VERSION, encode_group, encode_request
from tests.buffer.batching_client import BatchingClient
from tests.buffer.helpers import assert_same_group, edit_field, make_group

FIELDS = ["schema", "type", "req", "group_id", "prompt_index", "rewards", "lengths", "finish_reasons",
          "truncated", "meta", "arrays", "demos_attached", "actor_id", "ground_truth"]
hostile_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.just(math.nan), st.just(-math.inf),
    st.text(max_size=8), st.binary(max_size=8), st.lists(st.integers(-5, 2**40), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=3),
    st.just({"dtype": "<i4", "shape": [2**61]}), st.just({"dtype": "<i4", "shape": [-1]}),
    st.just({"dtype": "|O", "shape": [1]}), st.just([10**12] * 3),
)


def base_frames(seed: int = 0) -> list[bytes]:
    return [bytes(memoryview(f)) for f in encode_group(make_group(f"fz{seed}", seed=seed))]


@st.composite
def hostile_messages(draw) -> list[bytes]:
    kind = draw(st.sampled_from(["random", "group_field", "request_field", "truncate", "extend", "array",
                                 "values", "type", "frames"]))
    if kind == "random":
        return draw(st.lists(st.binary(max_size=200), min_size=1, max_size=9))
    frames = base_frames(draw(st.integers(0, 3)))
    req = {"schema": SCHEMA_VERSION, "type": "push", "req": draw(st.integers(0, 2**40)), "count": 1}
    if kind == "group_field":
        h = msgpack.unpackb(frames[0])
        h[draw(st.sampled_from(FIELDS))] = draw(hostile_values)
        frames[0] = msgpack.packb(h, use_bin_type=True)
    elif kind == "request_field":
        req[draw(st.sampled_from(["schema", "type", "req", "count", "want", "num_groups"]))] = draw(hostile_values)
    elif kind in ("truncate", "extend"):
        i = draw(st.integers(0, len(frames) - 1))
        cut = draw(st.integers(0, max(0, len(frames[i]) - 1)))
        frames[i] = frames[i][:cut] if kind == "truncate" else frames[i] + draw(st.binary(min_size=1, max_size=9))
    elif kind == "array":  # a random byte of the data frame: NaN/inf, negative ids/versions, bad mask bytes
        a = np.frombuffer(frames[1], np.uint8).copy()
        a[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from([0x7F, 0xFF, 0x80, 2]))
        frames[1] = a.tobytes()
    elif kind == "values":  # semantically bad numbers in well-formed arrays
        field, bad = draw(st.sampled_from([("logprobs", math.nan), ("logprobs", math.inf),
                                           ("logprobs", -math.inf), ("versions", -7), ("versions", -1),
                                           ("tokens", -1), ("prompt_tokens", -2**31)]))
        i = draw(st.integers(0, 1000))

        def put(a):
            a[i % a.size] = bad
            return a
        frames = edit_field(frames, field, put)
    elif kind == "type":  # message types that take no group, or unknown ones, with a group attached
        req["type"] = draw(st.sampled_from(["stats", "ping", "credit", "release", "x", ""]))
    else:
        frames = draw(st.permutations(frames))[: draw(st.integers(0, len(frames)))]
    return [msgpack.packb(req, use_bin_type=True), *frames]


def test_fuzzing_never_crashes_or_corrupts(start_buffer):
    addr = start_buffer(max_staleness=10**6, capacity_groups=10**6, max_message_mb=1)
    good = [make_group(f"good{i}", n=3, tokens=50, seed=100 + i) for i in range(3)]
    client = BatchingClient(addr, "actor", timeout_s=10)
    assert all(a.accepted for a in client.push_groups(good))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    replies = {"ok": 0, "rejected": 0}

    def send(frames) -> None:
        sock.send_multipart(frames)
        assert sock.poll(5000), "the buffer did not answer a hostile message"
        h = msgpack.unpackb(sock.recv_multipart()[0])
        assert h["type"] == "reply" and h["schema"] == SCHEMA_VERSION and isinstance(h["reason"], str)
        refused = not h["ok"] or any(not accepted for accepted, _, _ in h.get("acks", []))
        replies["rejected" if refused else "ok"] += 1

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(msg=hostile_messages())
    def fuzz(msg):
        send(msg)

    fuzz()
    send(encode_request("push", 1, {"count": 1}, base_frames()[:-1] + [b"\x01" * (1 << 20)]))  # > max_message_mb
    send([msgpack.packb({"schema": SCHEMA_VERSION, "type": "credit", "req": 2, "want": -1, "actor_version": 0})])
    sock.close(0)
    stats = client.stats()
    assert replies["ok"] + replies["rejected"] >= 300 and replies["rejected"] >= 100 and stats["rejected_total"] >= replies["rejected"]
    assert {"too_large", "bad_msgpack", "bad_schema", "unknown_type"} <= set(stats["rejected"])
    served = client.pull_batch(3, timeout_s=5)  # FIFO: the groups accepted before the fuzz come first
    for a, b in zip(good, served):
        assert_same_group(a, b)
    client.close()
