"""Wire format: exact round trips, and every validation rule rejecting what it should with its reason code."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from buffer.checks import Limits, WireError
from buffer.group_header import check_group_header, header_ok
from buffer.records import Sample
from buffer.wire import decode_group, decode_request, encode_demos, encode_group, encode_request, parse_demos
from tests.buffer.helpers import assert_same_group, edit_field, make_group

LIMITS = Limits(max_message_bytes=1 << 20, max_samples=16, max_tokens=4096)


def push_frames(group=None, header_edit=None, frame_edit=None):
    frames = [bytes(memoryview(f)) for f in encode_group(group or make_group("g"))]
    if header_edit:
        h = msgpack.unpackb(frames[0])
        header_edit(h)
        frames[0] = msgpack.packb(h, use_bin_type=True)
    if frame_edit:
        frame_edit(frames)
    return encode_request("push", 7, {"count": 1}, frames)


def reason_of(frames) -> str:
    """Reason code of the rejection: of the whole message, or of its (only) group."""
    try:
        req = decode_request(frames, LIMITS)
    except WireError as e:
        return e.reason
    assert isinstance(req.groups[0], WireError), "accepted a bad group"
    return req.groups[0].reason


def test_group_round_trip_is_exact():
    g = make_group("g1", n=5, prefix=3, meta={"demo_rows": 0, "nested": {"a": [1, 2.5, None, True]}})
    g.samples.append(Sample(tokens=np.zeros(0, np.int32), logprobs=np.zeros(0, np.float32),
                            versions=np.zeros(0, np.int32), prefix_mask=np.zeros(0, bool), reward=0.25))
    frames = [bytes(memoryview(f)) for f in encode_group(g)]
    assert_same_group(g, decode_group(frames))
    req = decode_request(encode_request("push", 3, {"count": 2}, frames + frames), LIMITS)
    assert req.type == "push" and req.req == 3 and req.groups[1].oldest_version == 0
    assert_same_group(g, req.groups[1].to_group())


def test_one_bad_group_does_not_sink_the_others():
    good = [bytes(memoryview(f)) for f in encode_group(make_group("good"))]
    bad = edit_field([bytes(memoryview(f)) for f in encode_group(make_group("bad"))], "logprobs", lambda a: a * np.nan)
    req = decode_request(encode_request("push", 1, {"count": 3}, good + bad + good), LIMITS)
    assert [getattr(g, "reason", "ok") for g in req.groups] == ["ok", "non_finite", "ok"]
    assert reason_of(encode_request("push", 1, {"count": 2}, good)) == "bad_frames"
    assert reason_of(encode_request("push", 1, {"count": 0}, [])) == "bad_value"


def test_encoder_converts_compatible_dtypes_and_names_the_bad_sample():
    g = make_group("g")
    g.samples[0].tokens = g.samples[0].tokens.astype(np.int64)
    g.samples[0].logprobs = g.samples[0].logprobs.astype(np.float64)
    assert decode_group([bytes(memoryview(f)) for f in encode_group(g)]).samples[0].tokens.dtype == np.int32
    g.samples[2].logprobs = g.samples[2].logprobs[:-1]
    with pytest.raises(WireError, match=r"samples\[2\]\.logprobs: .* values but") as e:
        encode_group(g)
    assert e.value.reason == "length_mismatch"
    g = make_group("g")
    g.samples[1].tokens = g.samples[1].tokens.astype(np.float32)
    with pytest.raises(WireError, match=r"samples\[1\]\.tokens") as e:
        encode_group(g)
    assert e.value.reason == "bad_dtype"


def _set(path, value):
    def edit(h):
        node = h
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


def _del(key):
    return lambda h: h.pop(key)


def _frame(i, fn):
    def edit(frames):
        frames[i] = fn(frames[i])
    return edit


HEADER_CASES = [
    ("bad_schema", _set(["schema"], 1)),
    ("unknown_type", _set(["type"], "gruop")),
    ("missing_field", _del("group_id")),
    ("missing_field", _del("rewards")),
    ("bad_type", _set(["prompt_index"], "3")),
    ("bad_type", _set(["prompt_index"], True)),  # bools are not ints
    ("bad_value", _set(["prompt_index"], -1)),
    ("bad_type", _set(["rewards", 0], "1")),
    ("non_finite", _set(["rewards", 1], math.nan)),
    ("non_finite", _set(["rewards", 1], math.inf)),
    ("length_mismatch", _set(["truncated"], [False])),
    ("length_mismatch", _set(["lengths", 0], 17)),  # sample lengths no longer add up to the frames
    ("too_many_samples", _set(["lengths"], [1] * 17)),
    ("too_many_tokens", _set(["lengths", 0], 10**9)),
    ("bad_dtype", _set(["arrays", "tokens", "dtype"], "<i8")),
    ("bad_dtype", _set(["arrays", "logprobs", "dtype"], "O")),
    ("bad_shape", _set(["arrays", "tokens", "shape"], [2, 3])),
    ("bad_shape", _set(["arrays", "versions", "shape"], [-4])),
    ("too_many_tokens", _set(["arrays", "tokens", "shape"], [2**62])),
    ("size_mismatch", _set(["arrays", "prompt_tokens", "shape"], [8])),
    ("bad_value", _set(["arrays", "extra"], {"dtype": "<i4", "shape": [0]})),
    ("bad_type", _set(["meta"], [1, 2])),
    ("non_finite", _set(["meta", "x"], math.nan)),
    ("bad_type", _set(["meta", "x"], b"bytes")),
    ("bad_value", _set(["meta", "demo_rows"], -1)),
    ("too_large", _set(["ground_truth"], "x" * 70000)),
    ("bad_value", _set(["group_id"], "")),
]


@pytest.mark.parametrize("reason,edit", HEADER_CASES)
def test_group_header_violations(reason, edit):
    assert reason_of(push_frames(header_edit=edit)) == reason


def _field(name, fn):
    def edit(frames):
        frames[:] = edit_field(frames, name, fn)
    return edit


def _at(i, value):
    def fn(a):
        a[i] = value
        return a
    return fn


FRAME_CASES = [  # group frames: 0 header, 1 data (prompt_tokens, tokens, logprobs, versions, prefix_mask)
    ("non_finite", _field("logprobs", _at(5, np.nan))),
    ("non_finite", _field("logprobs", lambda a: np.full_like(a, -np.inf))),
    ("bad_version", _field("versions", _at(3, -2))),
    ("bad_version", _field("versions", _at(3, -1))),  # a generated token may not carry the demo version
    ("bad_token", _field("tokens", _at(0, -5))),
    ("bad_token", _field("prompt_tokens", lambda a: -a - 1)),
    ("bad_mask", _frame(1, lambda b: b[:-1] + b"\x02")),  # prefix_mask is last in the data frame
    ("size_mismatch", _frame(1, lambda b: b[:-1])),
    ("size_mismatch", _frame(1, lambda b: b + b"\0\0\0\0")),
    ("bad_msgpack", _frame(0, lambda b: b[: len(b) // 2])),
    ("bad_msgpack", _frame(0, lambda b: b + b"\x00")),  # trailing bytes
    ("bad_frames", lambda frames: frames.pop()),
    ("bad_frames", lambda frames: frames.append(b"")),
]


@pytest.mark.parametrize("reason,edit", FRAME_CASES)
def test_group_frame_violations(reason, edit):
    assert reason_of(push_frames(frame_edit=edit)) == reason


def test_envelope_violations_keep_the_request_id():
    ok = push_frames()
    h = msgpack.unpackb(ok[0])
    cases = [("bad_schema", {**h, "schema": "1"}), ("bad_schema", {**h, "schema": 0}),
             ("unknown_type", {**h, "type": "drop_table"}), ("missing_field", {**h, "type": "credit"}),
             ("bad_type", {**h, "type": "credit", "want": 1.5, "actor_version": 0}),
             ("bad_value", {**h, "type": "credit", "want": -3, "actor_version": 0}),
             ("bad_frames", {**h, "type": "stats"}), ("bad_frames", {**h, "count": 2}),
             ("bad_value", {**h, "count": 0})]
    for reason, hh in cases:
        with pytest.raises(WireError) as e:
            decode_request([msgpack.packb(hh)] + ok[1:], LIMITS)
        assert (e.value.reason, e.value.req) == (reason, 7)
    assert reason_of([msgpack.packb([1, 2])]) == "bad_type"
    assert reason_of([]) == "bad_frames"
    big = ok[:-1] + [b"\x01" * (1 << 20)]
    assert reason_of(big) == "too_large"


def test_demo_block_round_trip_and_checks():
    demos = {4: np.arange(10), 9: np.array([3, 1, 2], np.int64)}
    fields, frames = encode_demos(demos, {4: 0.5})
    got = parse_demos(fields, frames, LIMITS, "d")
    assert [(i, a.tolist(), r) for i, a, r in got] == [(4, list(range(10)), 0.5), (9, [3, 1, 2], 1.0)]
    bad = dict(fields, lengths=[10, 4])
    with pytest.raises(WireError, match="lengths add up") as e:
        parse_demos(bad, frames, LIMITS, "d")
    assert e.value.reason == "length_mismatch"
    with pytest.raises(WireError) as e:
        parse_demos(dict(fields, indices=[4, 4]), frames, LIMITS, "d")
    assert e.value.reason == "bad_value"


# ---- property: arbitrary input only ever raises WireError ---------------------------------------------
json_like = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=5) |
                         st.binary(max_size=5), lambda c: st.lists(c, max_size=3) | st.dictionaries(
                             st.text(max_size=4), c, max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(st.binary(max_size=64), min_size=0, max_size=8))
def test_random_bytes_only_raise_wire_errors(frames):
    with pytest.raises(WireError):
        decode_request(frames, LIMITS)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(["schema", "type", "req", "group_id", "prompt_index", "rewards", "lengths",
                            "finish_reasons", "truncated", "meta", "arrays", "demos_attached", "actor_id"]),
       value=json_like, where=st.sampled_from(["request", "group"]))
def test_mutated_headers_only_raise_wire_errors(key, value, where):
    frames = push_frames()
    if where == "group":
        frames = push_frames(header_edit=_set([key], value))
    else:
        h = msgpack.unpackb(frames[0])
        h[key] = value
        frames[0] = msgpack.packb(h, use_bin_type=True)
    try:
        req = decode_request(frames, LIMITS)
    except WireError:
        return
    assert req.type == "push" and len(req.groups) == 1  # the group itself is either valid or a WireError


@settings(max_examples=400, deadline=None)
@given(edits=st.lists(st.tuples(st.sampled_from(["schema", "type", "group_id", "prompt_index", "rewards", "lengths",
                                                 "finish_reasons", "truncated", "meta", "arrays", "demos_attached",
                                                 "actor_id", "ground_truth", "data_source", "meta.demo_rows",
                                                 "arrays.tokens", "arrays.prompt_tokens.shape", "lengths.0"]),
                                json_like), max_size=2))
def test_fast_header_check_never_passes_what_the_exact_check_rejects(edits):
    h = msgpack.unpackb(encode_group(make_group("g"))[0])
    for path, value in edits:
        *parents, last = path.split(".")
        node = h
        try:
            for p in parents:
                node = node[p]
            node[int(last) if isinstance(node, list) else last] = value
        except (TypeError, KeyError, IndexError, ValueError):
            assume(False)  # an earlier edit replaced the container
    if header_ok(h, LIMITS):
        check_group_header(h, LIMITS)  # must not raise
