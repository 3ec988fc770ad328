"""Validation of a group's msgpack header: a fast all-or-nothing check and the exact, explaining one.

Every group is checked on arrival (and again by the learner's client), so the common case — a valid
header — is checked by `header_ok` in a few comprehensions. Only when it says no does
`check_group_header` walk the fields one by one to raise a `WireError` naming the first problem.
`header_ok(h)` must imply that `check_group_header(h)` passes (a test fuzzes exactly that); the reverse
need not hold, since a false "no" only costs the slow path.
"""

from __future__ import annotations

import math

from buffer import checks as C
from buffer.checks import SCHEMA_VERSION, Limits, WireError

FIELDS = ("prompt_tokens", "tokens", "logprobs", "versions", "prefix_mask", "env_mask")  # data frame order
DTYPES = {"prompt_tokens": "<i4", "tokens": "<i4", "logprobs": "<f4", "versions": "<i4", "prefix_mask": "|b1",
          "env_mask": "|b1"}
MAX_ID = 256
MAX_REASON = 32
MAX_INDEX = 1 << 62
_SCALARS = (type(None), bool, int, str)


def _meta_ok(meta: dict, limits: Limits) -> bool:
    """Flat meta of short scalars / lists of scalars (the usual case); anything else takes the slow path."""
    if len(meta) > 64 or len(meta) * 33 + 1 > limits.max_meta_items:
        return False
    for k, v in meta.items():
        if type(k) is not str:
            return False
        items = v if type(v) is list and len(v) <= 32 else (v,)
        for x in items:
            t = type(x)
            if t is float:
                if not math.isfinite(x):
                    return False
            elif t not in _SCALARS or (t is str and len(x) > limits.max_str) or t is list:
                return False
    d = meta.get("demo_rows", 0)
    return type(d) is int and 0 <= d <= limits.max_samples


def header_ok(h, limits: Limits) -> bool:
    """True only if `check_group_header(h, limits)` would pass (may say False for some valid headers)."""
    try:
        if type(h) is not dict or h["schema"] != SCHEMA_VERSION or type(h["schema"]) is not int \
                or h["type"] != "group":
            return False
        gid, lengths, rewards, reasons, trunc, meta, descs = (h["group_id"], h["lengths"], h["rewards"],
                                                              h["finish_reasons"], h["truncated"], h["meta"],
                                                              h["arrays"])
        n = len(lengths) if type(lengths) is list else -1
        if not (type(gid) is str and 0 < len(gid) <= MAX_ID and 0 <= n <= limits.max_samples
                and type(h["prompt_index"]) is int and 0 <= h["prompt_index"] <= MAX_INDEX
                and type(h["actor_id"]) is int and -MAX_INDEX <= h["actor_id"] <= MAX_INDEX
                and type(h["ground_truth"]) is str and len(h["ground_truth"]) <= limits.max_str
                and type(h["data_source"]) is str and len(h["data_source"]) <= limits.max_str
                and type(h["demos_attached"]) is int and 0 <= h["demos_attached"] <= n
                and type(rewards) is list and len(rewards) == n and type(reasons) is list and len(reasons) == n
                and type(trunc) is list and len(trunc) == n and type(meta) is dict and type(descs) is dict
                and len(descs) == len(FIELDS)):
            return False
        if not (all(type(x) is int and 0 <= x <= limits.max_tokens for x in lengths)
                and all(type(x) is float and math.isfinite(x) for x in rewards)
                and all(type(x) is str and len(x) <= MAX_REASON for x in reasons)
                and all(type(x) is bool for x in trunc) and _meta_ok(meta, limits)):
            return False
        total = sum(lengths)
        for f in FIELDS:
            d = descs[f]
            shape = d["shape"] if type(d) is dict else None
            if not (d["dtype"] == DTYPES[f] and type(shape) is list and len(shape) == 1 and type(shape[0]) is int
                    and (shape[0] == total if f != "prompt_tokens" else 0 <= shape[0] <= limits.max_tokens)):
                return False
        return True
    except (KeyError, TypeError):
        return False


def check_group_header(h, limits: Limits) -> None:
    """Check every field of a group header; raise `WireError` naming the first problem."""
    if not isinstance(h, dict):
        raise WireError(C.BAD_TYPE, f"group header: expected map, got {type(h).__name__}")
    if h.get("schema") != SCHEMA_VERSION or not C.is_int(h.get("schema")):
        raise WireError(C.BAD_SCHEMA, f"group header: schema {h.get('schema')!r}, this buffer speaks "
                                      f"{SCHEMA_VERSION}")
    if h.get("type") != "group":
        raise WireError(C.UNKNOWN_TYPE, f"group header: type {h.get('type')!r}, expected 'group'")
    gid = C.get_str(h, "group_id", "group", MAX_ID, allow_empty=False)
    w = f"group {gid!r}"
    C.get_int(h, "prompt_index", w, 0, MAX_INDEX)
    C.get_str(h, "ground_truth", w, limits.max_str)
    C.get_str(h, "data_source", w, limits.max_str)
    C.get_int(h, "actor_id", w, -MAX_INDEX, MAX_INDEX)
    C.check_meta(C.need(h, "meta", w), f"{w}.meta", limits)
    if "demo_rows" in h["meta"]:
        C.get_int(h["meta"], "demo_rows", f"{w}.meta", 0, limits.max_samples)
    n = len(C.get_list(h, "lengths", w, limits.max_list))
    if n > limits.max_samples:
        raise WireError(C.TOO_MANY_SAMPLES, f"{w}: {n} samples, limit {limits.max_samples}")
    lengths = C.int_list(h, "lengths", w, n, 0, limits.max_tokens, reason=C.TOO_MANY_TOKENS)
    C.float_list(h, "rewards", w, limits.max_samples, n)
    for i, r in enumerate(C.get_list(h, "finish_reasons", w, limits.max_samples, n)):
        if not isinstance(r, str) or len(r) > MAX_REASON:
            raise WireError(C.BAD_TYPE, f"{w}.finish_reasons[{i}]: expected a str of ≤ {MAX_REASON} chars")
    for i, t in enumerate(C.get_list(h, "truncated", w, limits.max_samples, n)):
        if not isinstance(t, bool):
            raise WireError(C.BAD_TYPE, f"{w}.truncated[{i}]: expected bool, got {type(t).__name__}")
    C.get_int(h, "demos_attached", w, 0, n)
    descs = C.get_map(h, "arrays", w)
    if set(descs) != set(FIELDS):
        raise WireError(C.BAD_VALUE, f"{w}.arrays: fields {sorted(descs)}, expected {sorted(FIELDS)}")
    total = sum(lengths)
    for f in FIELDS:
        cap = limits.max_tokens if f == "prompt_tokens" else limits.max_samples * limits.max_tokens
        _, count = C.array_desc(descs[f], f"{w}.arrays.{f}", (DTYPES[f],), cap)
        if f != "prompt_tokens" and count != total:
            raise WireError(C.LENGTH_MISMATCH, f"{w}.{f}: {count} values but the sample lengths add up to {total}")
