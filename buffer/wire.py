"""The buffer's wire contract: msgpack headers with a `schema` version, raw little-endian array frames.

A message is a list of ZMQ frames: frame 0 is a msgpack map {"schema", "type", "req", ...fields}; the
frames after it carry arrays whose dtype and shape the header declares (see `buffer.wire_group` for the
group layout). No pickle anywhere. `decode_request` / `decode_reply` validate everything — schema version,
message type, required fields and their types, dtypes per field, shape/length agreement, finite numbers,
size limits, versions ≥ -1 — and raise `WireError(reason, message)` on the first problem, so the buffer
can count the reason, answer with it and carry on. In a push of several groups each group is validated
on its own; a bad one comes back as its WireError in `Request.groups` so it does not sink the others.

Requests (client -> buffer) and their fields:
  ping | stats                          -
  credit       want, actor_version [, wait_ms]  -> granted, learner_version  (waits up to wait_ms for room)
  release      n                        -> released
  push         count + count group units -> acks [[accepted, reason, message], ...]  (one per group)
  set_version  version [, max_staleness] -> version, stats (as `stats` returns them; max_staleness raises
                                        the bound for new credit and arrivals, never lowers it)
  pull         num_groups, timeout_ms [, version]  -> count, version, lags, discarded + count group units
                                        (reason "timeout"; `version` = set_version first; discarded =
                                        [epoch, prompt] of groups filtered or dropped since the last pull)
  add_demos    demo block               -> stored
  snapshot | restore   path             -> path
Replies: {"schema", "type": "reply", "req", "ok", "reason", "message", ...}.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from buffer import checks as C
from buffer.checks import SCHEMA_VERSION, Limits, WireError
from buffer.group_header import MAX_INDEX
from buffer.wire_group import (
    GROUP_FRAMES,
    WireGroup,
    attach_demo,
    encode_group,
    pack,
    parse_group,
    unpack,
)

__all__ = ["SCHEMA_VERSION", "Limits", "WireError", "WireGroup", "encode_group", "parse_group", "decode_group",
           "attach_demo", "encode_request", "decode_request", "encode_reply", "decode_reply", "encode_demos",
           "parse_demos", "Request", "Reply", "REQUEST_TYPES"]

MAX_COUNT = 1 << 20
MAX_PATH = 4096
_INT_FIELDS = {
    "ping": {}, "stats": {},
    "credit": {"want": (0, MAX_COUNT), "actor_version": (0, MAX_INDEX)},
    "release": {"n": (0, MAX_COUNT)},
    "push": {"count": (1, 1 << 12)},
    "set_version": {"version": (0, MAX_INDEX)},
    "pull": {"num_groups": (1, 1 << 16), "timeout_ms": (0, 86_400_000)},
    "add_demos": {},
    "snapshot": {}, "restore": {},
}
_OPTIONAL_INT_FIELDS = {"credit": {"wait_ms": (0, 86_400_000)}, "pull": {"version": (0, MAX_INDEX)},
                        "set_version": {"max_staleness": (0, MAX_INDEX)}}
REQUEST_TYPES = tuple(_INT_FIELDS)


@dataclass
class Request:
    type: str
    req: int
    fields: dict
    groups: list[WireGroup | WireError] = field(default_factory=list)  # push: each group or why it is bad
    demos: list[tuple[int, np.ndarray, float]] | None = None


@dataclass
class Reply:
    req: int
    ok: bool
    reason: str
    message: str
    fields: dict
    payload: list = field(default_factory=list)


def decode_group(frames: list, limits: Limits | None = None):
    """Frames of one group unit -> validated `Group` (arrays are views of the frames)."""
    return parse_group(frames, limits or Limits()).to_group()


def _header(frames: list, limits: Limits, what: str) -> dict:
    """Unpack frame 0 (bounded by max_header_bytes); the schema and total size are checked afterwards so a
    bad message's request id can still be read and its rejection matched to the waiting client."""
    if not frames:
        raise WireError(C.BAD_FRAMES, f"{what}: empty message")
    h = unpack(frames[0], limits, f"{what} header")
    if not isinstance(h, dict):
        raise WireError(C.BAD_TYPE, f"{what} header: expected map, got {type(h).__name__}")
    return h


def _check_envelope(h: dict, frames: list, limits: Limits, what: str) -> None:
    if len(frames) > limits.max_frames:
        raise WireError(C.BAD_FRAMES, f"{what}: {len(frames)} frames, limit {limits.max_frames}")
    size = sum(C.buffer_of(f).nbytes for f in frames)
    if size > limits.max_message_bytes:
        raise WireError(C.TOO_LARGE, f"{what}: {size} bytes, limit {limits.max_message_bytes}")
    schema = h.get("schema")
    if not C.is_int(schema) or schema != SCHEMA_VERSION:
        raise WireError(C.BAD_SCHEMA, f"{what}: schema {schema!r}, this side speaks {SCHEMA_VERSION}")


def encode_request(type_: str, req: int, fields: dict | None = None, payload: list | tuple = ()) -> list:
    return [pack({"schema": SCHEMA_VERSION, "type": type_, "req": req, **(fields or {})}), *payload]


def decode_request(frames: list, limits: Limits) -> Request:
    h = _header(frames, limits, "request")
    req = h.get("req")
    req = req if C.is_int(req) and 0 <= req <= MAX_INDEX else None
    t = h.get("type")
    try:
        _check_envelope(h, frames, limits, "request")
        if not isinstance(t, str) or t not in _INT_FIELDS:
            raise WireError(C.UNKNOWN_TYPE, f"request: unknown message type {t!r} (known: {', '.join(REQUEST_TYPES)})")
        if req is None:
            C.get_int(h, "req", f"{t} request", 0, MAX_INDEX)
        where = f"{t} request"
        for name, (lo, hi) in _INT_FIELDS[t].items():
            C.get_int(h, name, where, lo, hi)
        for name, (lo, hi) in _OPTIONAL_INT_FIELDS.get(t, {}).items():
            if name in h:
                C.get_int(h, name, where, lo, hi)
        payload = frames[1:]
        out = Request(type=t, req=req, fields=h)
        if t == "push":
            count = h["count"]
            if len(payload) != count * GROUP_FRAMES:
                raise WireError(C.BAD_FRAMES, f"{where}: {count} groups need {count * GROUP_FRAMES} frames, got "
                                              f"{len(payload)}")
            out.groups = [_group_or_error(payload[i:i + GROUP_FRAMES], limits)
                          for i in range(0, len(payload), GROUP_FRAMES)]
        elif payload and t != "add_demos":
            raise WireError(C.BAD_FRAMES, f"{where}: takes no array frames, got {len(payload)}")
        if t == "add_demos":
            out.demos = parse_demos(h, payload, limits, where)
        elif t in ("snapshot", "restore"):
            C.get_str(h, "path", where, MAX_PATH, allow_empty=False)
        return out
    except WireError as e:
        e.req, e.msg_type = req, t if isinstance(t, str) and t in _INT_FIELDS else None
        raise


def _group_or_error(frames: list, limits: Limits) -> WireGroup | WireError:
    """One group of a push, validated on its own so a bad group does not sink the others."""
    try:
        g = parse_group(frames, limits)
    except WireError as e:
        return e
    if g.n == 0 and g.demo_rows == 0:
        return WireError(C.BAD_VALUE, f"group {g.group_id!r}: no samples and no demo rows")
    return g


def encode_reply(req: int | None, ok: bool = True, reason: str = "ok", message: str = "",
                 fields: dict | None = None, payload: list | tuple = ()) -> list:
    h = {"schema": SCHEMA_VERSION, "type": "reply", "req": -1 if req is None else req, "ok": ok,
         "reason": reason, "message": message, **(fields or {})}
    return [pack(h), *payload]


def decode_reply(frames: list, limits: Limits) -> Reply:
    h = _header(frames, limits, "reply")
    _check_envelope(h, frames, limits, "reply")
    if h.get("type") != "reply":
        raise WireError(C.UNKNOWN_TYPE, f"reply: type {h.get('type')!r}, expected 'reply'")
    return Reply(req=C.get_int(h, "req", "reply", -1, MAX_INDEX), ok=C.get_bool(h, "ok", "reply"),
                 reason=C.get_str(h, "reason", "reply", 64), message=C.get_str(h, "message", "reply", 1 << 16),
                 fields=h, payload=list(frames[1:]))


def groups_from_reply(rep: Reply, limits: Limits) -> list[WireGroup]:
    count = C.get_int(rep.fields, "count", "pull reply", 0, 1 << 16)
    if len(rep.payload) != count * GROUP_FRAMES:
        raise WireError(C.BAD_FRAMES, f"pull reply: {len(rep.payload)} frames for {count} groups")
    return [parse_group(rep.payload[i * GROUP_FRAMES:(i + 1) * GROUP_FRAMES], limits) for i in range(count)]


def encode_demos(demos: dict[int, np.ndarray], rewards: dict[int, float] | float = 1.0) -> tuple[dict, list]:
    """Demonstrations -> (header fields, [one frame of all tokens concatenated])."""
    idx = [int(i) for i in demos]
    toks = []
    for i in idx:
        a = np.asarray(demos[i])
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise WireError(C.BAD_DTYPE, f"demo {i}: expected a 1-D integer array, got {a.dtype} {a.shape}")
        toks.append(a.astype("<i4"))
    rew = [float(rewards.get(i, 1.0) if isinstance(rewards, dict) else rewards) for i in idx]
    flat = np.concatenate(toks) if toks else np.zeros(0, "<i4")
    fields = {"indices": idx, "lengths": [int(t.shape[0]) for t in toks], "rewards": rew,
              "arrays": {"tokens": {"dtype": "<i4", "shape": [int(flat.shape[0])]}}}
    return fields, [flat]


def parse_demos(h: dict, payload: list, limits: Limits, where: str) -> list[tuple[int, np.ndarray, float]]:
    idx = C.int_list(h, "indices", where, limits.max_list, 0, MAX_INDEX)
    lengths = C.int_list(h, "lengths", where, len(idx), 1, limits.max_tokens, length=len(idx))
    rewards = C.float_list(h, "rewards", where, len(idx), length=len(idx))
    if len(set(idx)) != len(idx):
        raise WireError(C.BAD_VALUE, f"{where}.indices: repeated prompt indices")
    if len(payload) != 1:
        raise WireError(C.BAD_FRAMES, f"{where}: expected 1 token frame, got {len(payload)}")
    desc = C.get_map(h, "arrays", where)
    flat = C.array_from(desc.get("tokens"), payload[0], f"{where}.tokens", ("<i4",), limits.max_list * 64)
    if flat.shape[0] != sum(lengths):
        raise WireError(C.LENGTH_MISMATCH, f"{where}.tokens: {flat.shape[0]} tokens, lengths add up to "
                                           f"{sum(lengths)}")
    if flat.size and flat.min() < 0:
        raise WireError(C.BAD_TOKEN, f"{where}.tokens[{C.first_bad(flat < 0)}]: negative token id")
    parts = np.split(flat, np.cumsum(lengths)[:-1]) if idx else []
    return list(zip(idx, parts, rewards))
