"""How one `Group` travels: a msgpack header frame + one frame of raw little-endian array bytes.

Layout of a group ("group unit", GROUP_FRAMES = 2 frames): frame 0 is a msgpack map with the scalar
fields, per-sample lists (rewards, lengths, finish_reasons, truncated) and an "arrays" map of
{"dtype", "shape"} descriptors for prompt_tokens, tokens, logprobs, versions, prefix_mask, env_mask; frame 1 holds
those arrays back to back in that order (the 4-byte ones first, so every view is aligned), each
per-sample field concatenated over samples (sample i spans lengths[i] entries). A fixed, small frame
count keeps per-message overhead low, validation runs vectorised over the whole group, and the buffer
keeps the validated frames and sends them on unchanged (zero-copy) instead of re-encoding a stored group
when it is served.

Environment tokens (`env_mask`, multi-turn rows): they carry version ENV_VERSION and log mu exactly 0, never
overlap a demonstration prefix, and do not count for the group's oldest version (the staleness the buffer
admits by); a policy token (neither prefix nor environment) must carry a version >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack
import numpy as np

from buffer import checks as C
from buffer.checks import SCHEMA_VERSION, Limits, WireError
from buffer.group_header import DTYPES, FIELDS, check_group_header, header_ok
from buffer.records import DEMO_VERSION, ENV_VERSION, Group, Sample, prompt_key

GROUP_FRAMES = 2


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(frame, limits: Limits, where: str):
    mv = C.buffer_of(frame)
    if mv.nbytes > limits.max_header_bytes:
        raise WireError(C.TOO_LARGE, f"{where}: header of {mv.nbytes} bytes, limit {limits.max_header_bytes}")
    try:
        return msgpack.unpackb(mv, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises several types (ExtraData, FormatError, ValueError, ...)
        raise WireError(C.BAD_MSGPACK, f"{where}: not valid msgpack ({type(e).__name__}: {e})") from None


_DT = {f: np.dtype(d) for f, d in DTYPES.items()}


def _as(x, dt: np.dtype, what: str) -> np.ndarray:
    """Convert an actor-side array to the wire dtype, refusing conversions that would change values."""
    if type(x) is np.ndarray and x.dtype == dt and x.ndim == 1:  # the common case, kept cheap
        return x
    a = np.asarray(x)
    if a.ndim != 1:
        raise WireError(C.BAD_SHAPE, f"{what}: expected a 1-D array, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, dt)
    if dt.kind == "b":
        if a.dtype.kind not in "biu" or not np.isin(a, (0, 1)).all():
            raise WireError(C.BAD_DTYPE, f"{what}: expected bool, got {a.dtype}")
    elif dt.kind == "i":
        if a.dtype.kind not in "biu":
            raise WireError(C.BAD_DTYPE, f"{what}: expected integers, got {a.dtype}")
        if a.min() < np.iinfo(dt).min or a.max() > np.iinfo(dt).max:
            raise WireError(C.BAD_VALUE, f"{what}: values do not fit in {dt}")
    elif a.dtype.kind not in "fiu":
        raise WireError(C.BAD_DTYPE, f"{what}: expected floats, got {a.dtype}")
    return a.astype(dt)


def _column(samples: list[Sample], f: str) -> list[np.ndarray]:
    dt = _DT[f]
    out = [getattr(s, f) for s in samples]
    for i, x in enumerate(out):
        if not (type(x) is np.ndarray and x.dtype == dt and x.ndim == 1):
            out[i] = _as(x, dt, f"samples[{i}].{f}")
    return out


def encode_group(group: Group, demos_attached: int = 0) -> list:
    """`Group` -> [header bytes, data frame] (a numpy buffer zmq can send without copying)."""
    samples = group.samples
    cols = {f: _column(samples, f) for f in FIELDS[1:]}
    lengths = [x.shape[0] for x in cols["tokens"]]
    for f in FIELDS[2:]:
        got = [x.shape[0] for x in cols[f]]
        if got != lengths:
            i = next(i for i, (a, b) in enumerate(zip(got, lengths)) if a != b)
            raise WireError(C.LENGTH_MISMATCH, f"samples[{i}].{f}: {got[i]} values but {lengths[i]} tokens")
    prompt = _as(group.prompt_tokens, _DT["prompt_tokens"], "prompt_tokens")
    total = sum(lengths)
    header = {
        "schema": SCHEMA_VERSION, "type": "group", "group_id": group.group_id,
        "prompt_index": int(group.prompt_index), "ground_truth": group.ground_truth,
        "data_source": group.data_source, "actor_id": int(group.actor_id), "meta": group.meta,
        "rewards": [float(s.reward) for s in samples], "lengths": lengths,
        "finish_reasons": [s.finish_reason for s in samples], "truncated": [bool(s.truncated) for s in samples],
        "demos_attached": demos_attached,
        "arrays": {f: {"dtype": DTYPES[f], "shape": [prompt.shape[0] if f == "prompt_tokens" else total]}
                   for f in FIELDS},
    }
    try:
        hb = pack(header)
    except (TypeError, ValueError, OverflowError) as e:
        raise WireError(C.BAD_TYPE, f"group {group.group_id!r}: cannot encode ({e})") from None
    return [hb, _data_frame([[prompt]] + [cols[f] for f in FIELDS[1:]])]


def _data_frame(columns: list[list[np.ndarray]]) -> np.ndarray:
    """The FIELDS' arrays back to back in one buffer: one copy, one numpy call per field."""
    sizes = [sum(a.shape[0] for a in col) * _DT[f].itemsize for f, col in zip(FIELDS, columns)]
    out = np.empty(sum(sizes), np.uint8)
    o = 0
    for f, col, size in zip(FIELDS, columns, sizes):
        if size:
            np.concatenate(col, out=out[o:o + size].view(_DT[f]))
        o += size
    return out


@dataclass
class WireGroup:
    """A validated group as the buffer holds it: the raw frames plus the few facts the buffer needs."""

    header: dict
    frames: list  # [header bytes, data frame], exactly what is sent on
    arrays: dict[str, np.ndarray] = field(repr=False)
    oldest_version: int | None = None
    bound: int | None = None  # versions: the staleness bound in force when the buffer admitted it (`BufferCore.push`)

    group_id = property(lambda self: self.header["group_id"])
    prompt_index = property(lambda self: self.header["prompt_index"])
    n = property(lambda self: len(self.header["lengths"]))
    demo_rows = property(lambda self: self.header["meta"].get("demo_rows", 0))
    demos_attached = property(lambda self: self.header.get("demos_attached", 0))
    key = property(lambda self: prompt_key(self.header["meta"], self.header["prompt_index"]))

    def rewards(self) -> np.ndarray:
        return np.asarray(self.header["rewards"], dtype=np.float64)

    def nbytes(self) -> int:
        return sum(C.buffer_of(f).nbytes for f in self.frames)

    def to_group(self, copy: bool = False) -> Group:
        """The `Group`; its arrays are views of the frames (writable for received frames) unless copy."""
        h, a = self.header, self.arrays
        if copy:
            a = {f: x.copy() for f, x in a.items()}
        toks, lps, vers, mask, env = a["tokens"], a["logprobs"], a["versions"], a["prefix_mask"], a["env_mask"]
        samples, o = [], 0
        for length, r, fr, tr in zip(h["lengths"], h["rewards"], h["finish_reasons"], h["truncated"]):
            e = o + length
            samples.append(Sample(tokens=toks[o:e], logprobs=lps[o:e], versions=vers[o:e], prefix_mask=mask[o:e],
                                  reward=float(r), finish_reason=fr, truncated=tr, env_mask=env[o:e]))
            o = e
        prompt = a["prompt_tokens"]
        return Group(group_id=h["group_id"], prompt_index=h["prompt_index"], prompt_tokens=prompt,
                     samples=samples, ground_truth=h["ground_truth"], data_source=h["data_source"],
                     actor_id=h["actor_id"], meta=h["meta"])


def parse_group(frames: list, limits: Limits) -> WireGroup:
    """Validate a group unit completely and return it; raise `WireError` on the first problem."""
    if len(frames) != GROUP_FRAMES:
        raise WireError(C.BAD_FRAMES, f"group: expected {GROUP_FRAMES} frames, got {len(frames)}")
    h = unpack(frames[0], limits, "group header")
    if not header_ok(h, limits):  # the fast check said no: find and report the exact problem
        check_group_header(h, limits)
    w = f"group {h['group_id']!r}"
    descs, layout, offset = h["arrays"], [], 0
    for f in FIELDS:
        count = descs[f]["shape"][0]
        layout.append((f, count, offset))
        offset += count * _DT[f].itemsize
    data = C.buffer_of(frames[1])
    if data.nbytes != offset:
        raise WireError(C.SIZE_MISMATCH, f"{w}: the arrays' shapes need {offset} bytes, the data frame holds "
                                         f"{data.nbytes}")
    arrays = {f: np.frombuffer(data, dtype=_DT[f], count=count, offset=o) for f, count, o in layout}
    return WireGroup(header=h, frames=list(frames), arrays=arrays, oldest_version=_check_values(arrays, w))


def _check_values(a: dict[str, np.ndarray], w: str) -> int | None:
    """Value checks, vectorised over the whole group; returns the oldest on-policy version (None if the
    group has no generated token)."""
    for f in ("prompt_tokens", "tokens"):
        if a[f].size and a[f].min() < 0:
            raise WireError(C.BAD_TOKEN, f"{w}.{f}[{C.first_bad(a[f] < 0)}]: negative token id")
    lp = a["logprobs"]
    if not np.isfinite(lp).all():
        i = C.first_bad(~np.isfinite(lp))
        raise WireError(C.NON_FINITE, f"{w}.logprobs[{i}]: {lp[i]} is not finite")
    mask_max = _check_mask(a["prefix_mask"], f"{w}.prefix_mask")
    env_max = _check_mask(a["env_mask"], f"{w}.env_mask")
    v = a["versions"]
    if v.size == 0:
        return None
    if env_max:
        _check_env_tokens(a, w)
    lowest = int(v.min())
    if lowest < min(DEMO_VERSION, ENV_VERSION):
        i = C.first_bad(v < min(DEMO_VERSION, ENV_VERSION))
        raise WireError(C.BAD_VERSION, f"{w}.versions[{i}]: {v[i]} is below {min(DEMO_VERSION, ENV_VERSION)}")
    if mask_max or env_max:  # demonstration or environment tokens: only the policy's count
        gen = v[~(a["prefix_mask"] | a["env_mask"])]
        if gen.size == 0:
            return None
        lowest = int(gen.min())
    if lowest < 0:
        raise WireError(C.BAD_VERSION, f"{w}.versions: a generated (non-prefix) token carries version {lowest}; "
                                       f"only demonstration and environment tokens may carry {DEMO_VERSION}")
    return lowest


def _check_mask(mask: np.ndarray, where: str) -> int:
    """The largest byte of a bool mask (0 or 1); raise when a byte is neither."""
    raw = mask.view(np.uint8)
    top = int(raw.max()) if raw.size else 0
    if top > 1:
        i = C.first_bad(raw > 1)
        raise WireError(C.BAD_MASK, f"{where}[{i}]: byte {raw[i]} is not 0/1")
    return top


def _check_env_tokens(a: dict[str, np.ndarray], w: str) -> None:
    """Environment tokens: version ENV_VERSION, log mu 0, never inside a demonstration prefix."""
    env = a["env_mask"]
    both = env & a["prefix_mask"]
    if both.any():
        raise WireError(C.BAD_MASK, f"{w}.env_mask[{C.first_bad(both)}]: a token is both a demonstration and an "
                                    "environment token")
    bad = env & (a["versions"] != ENV_VERSION)
    if bad.any():
        i = C.first_bad(bad)
        raise WireError(C.BAD_VERSION, f"{w}.versions[{i}]: environment token carries version {a['versions'][i]}, "
                                       f"expected {ENV_VERSION}")
    bad = env & (a["logprobs"] != 0)
    if bad.any():
        i = C.first_bad(bad)
        raise WireError(C.BAD_VALUE, f"{w}.logprobs[{i}]: environment token carries log mu {a['logprobs'][i]}, "
                                     "expected 0 (no policy sampled it)")


def demo_sample_header(h: dict, k: int, length: int, reward: float) -> dict:
    """The header of `h` with k demonstration rows of `length` tokens appended."""
    out = dict(h)
    out["rewards"] = h["rewards"] + [float(reward)] * k
    out["lengths"] = h["lengths"] + [length] * k
    out["finish_reasons"] = h["finish_reasons"] + ["demo"] * k
    out["truncated"] = h["truncated"] + [False] * k
    out["demos_attached"] = h.get("demos_attached", 0) + k
    total = sum(out["lengths"])
    out["arrays"] = {f: {"dtype": DTYPES[f], "shape": [total if f != "prompt_tokens" else
                                                        h["arrays"][f]["shape"][0]]} for f in FIELDS}
    return out


def attach_demo(wg: WireGroup, tokens: np.ndarray, reward: float, k: int) -> WireGroup:
    """A new WireGroup with k full demonstration rows appended (prefix_mask True, versions -1, logprobs 0)."""
    length = int(tokens.shape[0])
    fill = {"tokens": tokens, "logprobs": np.zeros(length, "<f4"), "versions": np.full(length, DEMO_VERSION, "<i4"),
            "prefix_mask": np.ones(length, "|b1"), "env_mask": np.zeros(length, "|b1")}
    data = _data_frame([[wg.arrays["prompt_tokens"]]] + [[wg.arrays[f]] + [fill[f]] * k for f in FIELDS[1:]])
    header = demo_sample_header(wg.header, k, length, reward)
    frames = [pack(header), data]
    arrays, o = {}, 0
    for f in FIELDS:
        count = header["arrays"][f]["shape"][0]
        arrays[f] = np.frombuffer(data, dtype=_DT[f], count=count, offset=o)
        o += count * _DT[f].itemsize
    return WireGroup(header=header, frames=frames, arrays=arrays, oldest_version=wg.oldest_version)
