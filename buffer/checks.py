"""Validation primitives of the wire format: the error type, size limits and typed field readers.

Everything that crosses a socket into the buffer is hostile until proven otherwise, so every reader here
checks presence, Python type (bools are not ints), range and size, and raises a `WireError` whose
`reason` is a short stable code (counted in the buffer's stats) and whose `message` names the field.
Arrays travel as raw little-endian bytes described by {"dtype", "shape"}; `array_from` checks the dtype
against the field's allowed set and the byte count against the declared shape before viewing the bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SCHEMA_VERSION = 2

# Reason codes (stable strings: stats count them, clients branch on them).
TOO_LARGE = "too_large"
BAD_FRAMES = "bad_frames"
BAD_MSGPACK = "bad_msgpack"
BAD_SCHEMA = "bad_schema"
UNKNOWN_TYPE = "unknown_type"
MISSING_FIELD = "missing_field"
BAD_TYPE = "bad_type"
BAD_VALUE = "bad_value"
BAD_DTYPE = "bad_dtype"
BAD_SHAPE = "bad_shape"
SIZE_MISMATCH = "size_mismatch"
LENGTH_MISMATCH = "length_mismatch"
NON_FINITE = "non_finite"
BAD_VERSION = "bad_version"
BAD_TOKEN = "bad_token"
BAD_MASK = "bad_mask"
TOO_MANY_SAMPLES = "too_many_samples"
TOO_MANY_TOKENS = "too_many_tokens"


class WireError(ValueError):
    """A message that does not follow the wire contract. `reason` is a stable code, `message` says what."""

    def __init__(self, reason: str, message: str, *, req: int | None = None, msg_type: str | None = None):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.req = req  # request id, when it could be read before the problem was found
        self.msg_type = msg_type  # message type, likewise


@dataclass(frozen=True)
class Limits:
    """Size limits applied while decoding (all checked before any large allocation)."""

    max_message_bytes: int = 64 << 20  # all frames of one message together
    max_header_bytes: int = 4 << 20  # one msgpack header frame
    max_frames: int = 1 << 16  # frames in one message
    max_samples: int = 1024  # samples (rows) in one group
    max_tokens: int = 1 << 20  # tokens in one sample, one prompt or one demonstration
    max_str: int = 1 << 16  # characters in one string field
    max_list: int = 1 << 20  # entries in one list field (e.g. demo indices)
    max_meta_items: int = 4096  # scalars + containers inside a group's meta
    max_meta_depth: int = 8


def _type_name(v) -> str:
    return type(v).__name__


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def need(h: dict, key: str, where: str):
    if key not in h:
        raise WireError(MISSING_FIELD, f"{where}: missing required field {key!r}")
    return h[key]


def get_int(h: dict, key: str, where: str, lo: int | None = None, hi: int | None = None,
            reason: str = BAD_VALUE) -> int:
    v = need(h, key, where)
    if not is_int(v):
        raise WireError(BAD_TYPE, f"{where}.{key}: expected int, got {_type_name(v)}")
    check_range(v, f"{where}.{key}", lo, hi, reason)
    return v


def check_range(v, what: str, lo=None, hi=None, reason: str = BAD_VALUE) -> None:
    if lo is not None and v < lo:
        raise WireError(reason, f"{what}: {v} is below the minimum {lo}")
    if hi is not None and v > hi:
        raise WireError(reason, f"{what}: {v} is above the maximum {hi}")


def get_str(h: dict, key: str, where: str, max_len: int, allow_empty: bool = True) -> str:
    v = need(h, key, where)
    if not isinstance(v, str):
        raise WireError(BAD_TYPE, f"{where}.{key}: expected str, got {_type_name(v)}")
    if len(v) > max_len:
        raise WireError(TOO_LARGE, f"{where}.{key}: {len(v)} characters, limit {max_len}")
    if not allow_empty and not v:
        raise WireError(BAD_VALUE, f"{where}.{key}: must not be empty")
    return v


def get_bool(h: dict, key: str, where: str) -> bool:
    v = need(h, key, where)
    if not isinstance(v, bool):
        raise WireError(BAD_TYPE, f"{where}.{key}: expected bool, got {_type_name(v)}")
    return v


def get_map(h: dict, key: str, where: str) -> dict:
    v = need(h, key, where)
    if not isinstance(v, dict):
        raise WireError(BAD_TYPE, f"{where}.{key}: expected map, got {_type_name(v)}")
    return v


def get_list(h: dict, key: str, where: str, max_len: int, length: int | None = None) -> list:
    v = need(h, key, where)
    if not isinstance(v, list):
        raise WireError(BAD_TYPE, f"{where}.{key}: expected list, got {_type_name(v)}")
    if len(v) > max_len:
        raise WireError(TOO_LARGE, f"{where}.{key}: {len(v)} entries, limit {max_len}")
    if length is not None and len(v) != length:
        raise WireError(LENGTH_MISMATCH, f"{where}.{key}: {len(v)} entries, expected {length}")
    return v


def int_list(h: dict, key: str, where: str, max_len: int, lo=None, hi=None, length=None,
             reason: str = BAD_VALUE) -> list[int]:
    v = get_list(h, key, where, max_len, length)
    if all(type(x) is int for x in v) and (not v or ((lo is None or min(v) >= lo) and (hi is None or max(v) <= hi))):
        return v  # fast path; the loop below finds the first offender for the message
    for i, x in enumerate(v):
        if not is_int(x):
            raise WireError(BAD_TYPE, f"{where}.{key}[{i}]: expected int, got {_type_name(x)}")
        check_range(x, f"{where}.{key}[{i}]", lo, hi, reason)
    return v


def float_list(h: dict, key: str, where: str, max_len: int, length=None) -> list[float]:
    v = get_list(h, key, where, max_len, length)
    if all(type(x) is float and math.isfinite(x) for x in v):
        return v
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise WireError(BAD_TYPE, f"{where}.{key}[{i}]: expected a number, got {_type_name(x)}")
        if not math.isfinite(x):
            raise WireError(NON_FINITE, f"{where}.{key}[{i}]: {x} is not finite")
    return [float(x) for x in v]


def check_meta(meta, where: str, limits: Limits) -> None:
    """A group's meta must be small and JSON-able: str keys; None/bool/int/finite float/str/list/map."""
    budget = [limits.max_meta_items]

    def walk(v, path: str, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise WireError(TOO_LARGE, f"{where}: more than {limits.max_meta_items} items")
        if depth > limits.max_meta_depth:
            raise WireError(TOO_LARGE, f"{path}: nested deeper than {limits.max_meta_depth}")
        if v is None or isinstance(v, (bool, int)):
            return
        if isinstance(v, float):
            if not math.isfinite(v):
                raise WireError(NON_FINITE, f"{path}: {v} is not finite (meta must be JSON-able)")
        elif isinstance(v, str):
            if len(v) > limits.max_str:
                raise WireError(TOO_LARGE, f"{path}: string of {len(v)} characters")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]", depth + 1)
        elif isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise WireError(BAD_TYPE, f"{path}: key {k!r} is not a str")
                walk(x, f"{path}.{k}", depth + 1)
        else:
            raise WireError(BAD_TYPE, f"{path}: {_type_name(v)} is not JSON-able")

    if not isinstance(meta, dict):
        raise WireError(BAD_TYPE, f"{where}: expected map, got {_type_name(meta)}")
    walk(meta, where, 0)


def buffer_of(frame) -> memoryview:
    """A read-only-or-not memoryview over a zmq.Frame, bytes, bytearray, memoryview or numpy array."""
    buf = getattr(frame, "buffer", None)  # zmq.Frame
    return buf if isinstance(buf, memoryview) else memoryview(frame)


_DTYPES: dict[str, np.dtype] = {}


def array_desc(desc, where: str, allowed: tuple[str, ...], max_len: int) -> tuple[np.dtype, int]:
    """Check a 1-D array descriptor {"dtype": str, "shape": [n]} -> (dtype, n)."""
    if not isinstance(desc, dict):
        raise WireError(BAD_TYPE, f"{where}: array descriptor must be a map, got {_type_name(desc)}")
    dtype = get_str(desc, "dtype", where, 16)
    if dtype not in allowed:
        raise WireError(BAD_DTYPE, f"{where}: dtype {dtype!r} not allowed (allowed: {', '.join(allowed)})")
    shape = get_list(desc, "shape", where, 8)
    if len(shape) != 1:
        raise WireError(BAD_SHAPE, f"{where}: expected a 1-D shape, got {shape!r}")
    n = shape[0]
    if not is_int(n):
        raise WireError(BAD_TYPE, f"{where}.shape[0]: expected int, got {_type_name(n)}")
    if n < 0:
        raise WireError(BAD_SHAPE, f"{where}.shape[0]: negative size {n}")
    if n > max_len:
        raise WireError(TOO_MANY_TOKENS, f"{where}.shape[0]: {n} elements, limit {max_len}")
    return _DTYPES.get(dtype) or _DTYPES.setdefault(dtype, np.dtype(dtype)), n


def array_from(desc, frame, where: str, allowed: tuple[str, ...], max_len: int) -> np.ndarray:
    """View a whole frame as the 1-D array `desc` declares, after checking the descriptor and byte count."""
    dt, n = array_desc(desc, where, allowed, max_len)
    mv = buffer_of(frame)
    if mv.nbytes != n * dt.itemsize:
        raise WireError(SIZE_MISMATCH, f"{where}: shape [{n}] of {dt.str} needs {n * dt.itemsize} bytes, "
                                       f"the frame holds {mv.nbytes}")
    return np.frombuffer(mv, dtype=dt, count=n)


def first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])
