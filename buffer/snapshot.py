"""Snapshot / restore of the buffer's contents for exact resume: one msgpack file, written atomically.

Holds the stored groups (their validated wire frames, byte for byte, and the staleness bound each was
admitted under), the demonstrations, the counters,
the lag histogram, the learner version and the recent group ids (so actors re-sending after a resume
are still recognised as duplicates). Credits are not saved: actors are restarted on resume and ask
again. Restoring re-validates every group and demonstration with the wire checks and swaps the state
in only when the whole file is good, so a damaged file leaves the running buffer untouched.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable

import msgpack

from buffer import checks as C
from buffer.checks import SCHEMA_VERSION, WireError
from buffer.core import BufferCore
from buffer.wire import encode_demos, parse_demos
from buffer.wire_group import parse_group

SEEN_KEPT = 1 << 16  # most recent group ids saved for duplicate detection after resume


def write_snapshot(core: BufferCore, path: str) -> int:
    """Write `core`'s state to `path` (tmp file + fsync + rename); returns the bytes written."""
    fields, frames = encode_demos({i: a for i, (a, _) in core.demos.items()},
                                  {i: r for i, (_, r) in core.demos.items()})
    seen = list(core.seen.items())[-SEEN_KEPT:]
    state = {
        "schema": SCHEMA_VERSION, "type": "snapshot", "version": core.version,
        "groups": [[C.buffer_of(f) for f in g.frames] for g in core.queue],
        "bounds": [g.bound for g in core.queue],
        "max_staleness": core.max_staleness,  # a bound raised mid-run (max_staleness: auto) outlives a restart
        "demos": {**fields, "tokens": C.buffer_of(frames[0])},
        "counts": [[k, v] for k, v in core.counts.items()],
        "lag_hist": [[k, v] for k, v in core.lag_hist.items()],
        "seen": [[k, v] for k, v in seen],
    }
    data = msgpack.packb(state, use_bin_type=True)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".buffer-snapshot-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return len(data)


def _pairs(h: dict, key: str, ktype, vtype) -> list:
    out = C.get_list(h, key, "snapshot", 1 << 24)
    for i, p in enumerate(out):
        if not (isinstance(p, list) and len(p) == 2 and ktype(p[0]) and vtype(p[1])):
            raise WireError(C.BAD_TYPE, f"snapshot.{key}[{i}]: malformed entry {p!r:.80}")
    return out


def _count(x) -> bool:
    return C.is_int(x) and x >= 0


def restore_snapshot(core: BufferCore, path: str, exclude: Iterable = ()) -> dict:
    """Replace `core`'s state with the file's; raises WireError (state untouched) if anything is wrong.
    `exclude`: (epoch, prompt_index) keys whose groups are not restored (a restarted buffer must not
    serve again what was trained after the snapshot); they are counted as `excluded`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise WireError("bad_snapshot", f"cannot read {path}: {e}") from None
    try:
        h = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:
        raise WireError(C.BAD_MSGPACK, f"snapshot {path}: not valid msgpack ({type(e).__name__}: {e})") from None
    if not isinstance(h, dict) or h.get("type") != "snapshot":
        raise WireError("bad_snapshot", f"{path} is not a buffer snapshot")
    if h.get("schema") != SCHEMA_VERSION:
        raise WireError(C.BAD_SCHEMA, f"snapshot {path}: schema {h.get('schema')!r}, expected {SCHEMA_VERSION}")
    limits = dataclasses.replace(core.limits, max_list=1 << 24, max_header_bytes=64 << 20)
    version = C.get_int(h, "version", "snapshot", 0, 1 << 62)
    groups = deque()
    for i, frames in enumerate(C.get_list(h, "groups", "snapshot", 1 << 24)):
        if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
            raise WireError(C.BAD_TYPE, f"snapshot.groups[{i}]: expected a list of byte frames")
        groups.append(parse_group(frames, limits))
    bounds = C.get_list(h, "bounds", "snapshot", 1 << 24) if "bounds" in h else [core.max_staleness] * len(groups)
    if len(bounds) != len(groups) or not all(_count(b) for b in bounds):
        raise WireError(C.BAD_VALUE, f"snapshot {path}: need one staleness bound ≥ 0 per stored group")
    for g, b in zip(groups, bounds):
        g.bound = b
    bound = C.get_int(h, "max_staleness", "snapshot", 0, 1 << 30) if "max_staleness" in h else core.max_staleness
    dh = C.get_map(h, "demos", "snapshot")
    tokens = C.need(dh, "tokens", "snapshot.demos")
    if not isinstance(tokens, bytes):
        raise WireError(C.BAD_TYPE, "snapshot.demos.tokens: expected bytes")
    demos = parse_demos(dh, [tokens], limits, "snapshot.demos")
    counts = _pairs(h, "counts", lambda k: isinstance(k, str), _count)
    lags = _pairs(h, "lag_hist", _count, _count)
    seen = _pairs(h, "seen", lambda k: isinstance(k, str), lambda v: isinstance(v, bool))
    demo_total = sum(int(a.shape[0]) for _, a, _ in demos)
    if demo_total > core.s.max_demo_tokens:
        raise WireError(C.TOO_LARGE, f"snapshot {path}: {demo_total} demonstration tokens, limit "
                                     f"{core.s.max_demo_tokens}")
    ids = [g.group_id for g in groups]
    if len(set(ids)) != len(ids):
        raise WireError(C.BAD_VALUE, f"snapshot {path}: a group id appears twice")
    drop = {(int(e), int(i)) for e, i in exclude}
    kept = deque(g for g in groups if g.key not in drop)
    # Everything validated: swap it in.
    core.version = version
    core.max_staleness = max(core.max_staleness, bound)  # never lowered (`BufferCore.set_version`)
    core.served_at_version = 0
    core.queue = kept
    core.demos, core.demo_tokens = {}, 0
    core.add_demos(demos)
    core.counts = Counter(dict(counts))
    core.lag_hist = Counter(dict(lags))
    core.seen = OrderedDict((k, v) for k, v in seen)
    for gid in ids:
        core.seen.setdefault(gid, True)
    core.ledger.clear()
    return {"version": version, "groups": len(kept), "excluded": len(groups) - len(kept), "demos": len(demos),
            "counts": dict(counts)}  # the counters the restored buffer goes on from (launch.state.buffer_keeper)
