"""Bucket packing: many named tensors (or sparse patches) -> a few large flat byte buffers, and back.

Why: one collective per tensor costs one round of latency per parameter (hundreds for a 0.5B
model, thousands for a 7B one) and small messages never reach the link's bandwidth. Packing the
tensors of one dtype into a contiguous buffer of up to ``bucket_bytes`` and broadcasting that buffer
in one collective makes the transfer bandwidth-bound.

A bucket on the wire is three messages, all plain bytes (no pickle):
  1. a fixed ``int64[2]`` prefix ``(header_len, payload_nbytes)`` so the receiver can size (2) and (3);
  2. a UTF-8 JSON header: version, push sequence, bucket index, dtype, names, shapes, element offsets,
     and whether this is the last bucket of the push;
  3. the payload: the tensors' bytes back to back, each starting at ``offsets[i] * itemsize``.
A patch bucket (a delta push, ``weightsync.delta``) also has ``counts`` in its header: entry i changes
``counts[i]`` elements of the tensor ``names[i]`` of full shape ``shapes[i]``. Its indices travel in two
bytes each: entry i's flat tensor is cut into blocks of ``PATCH_BLOCK`` = 65536 elements, and an index
is sent as its offset inside its block (uint16) plus, once per block, the number of changed elements
in it (int32). The payload is three sections, each padded to a multiple of 8 bytes so the next is
aligned for any dtype: the block counts of every entry in order (ceil(numel / 65536) per entry),
then the uint16 offsets and then the values in ``dtype``, both holding the entries back to back from
element ``offsets[i]``. So a changed bf16 element costs 4 bytes (2 with int32 indices would be 6):
a delta beats a dense push while under half of the elements change.

This module is torch-only (the learner imports it; it must not import vllm).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

HEADER_SCHEMA = 1

# dtypes that may travel; names are the torch attribute names so both sides agree without pickle.
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


@dataclass
class Patch:
    """One tensor's delta, in checkpoint (HF) coordinates: ``full.view(-1)[indices] = values``."""

    name: str
    indices: torch.Tensor  # int32, 1-D, flat indices into the full tensor
    values: torch.Tensor  # 1-D, wire dtype
    shape: tuple[int, ...]  # full tensor shape


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TypeError(f"dtype {dtype} cannot be sent; supported: {sorted(_DTYPES)}")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} in bucket header; supported: {sorted(_DTYPES)}") from None


@dataclass
class BucketHeader:
    """Metadata that travels ahead of one bucket's payload."""

    version: int
    seq: int
    index: int
    dtype: str
    names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # in elements of `dtype`
    nbytes: int = 0
    last: bool = False
    counts: list[int] | None = None  # patch bucket: changed elements per entry; None = dense tensors

    def encode(self) -> bytes:
        return json.dumps(
            {
                "schema": HEADER_SCHEMA,
                "version": self.version,
                "seq": self.seq,
                "index": self.index,
                "dtype": self.dtype,
                "names": self.names,
                "shapes": self.shapes,
                "offsets": self.offsets,
                "nbytes": self.nbytes,
                "last": self.last,
                "counts": self.counts,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> BucketHeader:
        d = json.loads(raw.decode())
        if d.get("schema") != HEADER_SCHEMA:
            raise ValueError(f"bucket header schema {d.get('schema')!r}, expected {HEADER_SCHEMA}")
        hdr = cls(
            version=int(d["version"]),
            seq=int(d["seq"]),
            index=int(d["index"]),
            dtype=str(d["dtype"]),
            names=list(d["names"]),
            shapes=[list(s) for s in d["shapes"]],
            offsets=list(d["offsets"]),
            nbytes=int(d["nbytes"]),
            last=bool(d["last"]),
            counts=None if d.get("counts") is None else [int(c) for c in d["counts"]],
        )
        hdr.validate()
        return hdr

    def validate(self) -> None:
        n = len(self.names)
        if len(self.shapes) != n or len(self.offsets) != n or (self.counts is not None and len(self.counts) != n):
            raise ValueError(f"bucket {self.index}: {n} names but {len(self.shapes)} shapes / "
                             f"{len(self.offsets)} offsets / {len(self.counts or [])} counts")
        itemsize = torch.empty((), dtype=dtype_from_name(self.dtype)).element_size()
        lengths = [_numel(s) for s in self.shapes] if self.counts is None else self.counts
        if self.counts is None:
            elements = self.nbytes // itemsize
        else:
            elements, blocks = sum(self.counts), sum(_blocks(s) for s in self.shapes)
            if self.nbytes != patch_nbytes(elements, itemsize, blocks):
                raise ValueError(f"patch bucket {self.index}: {elements} elements of {self.dtype} need "
                                 f"{patch_nbytes(elements, itemsize, blocks)} bytes, the header says {self.nbytes}")
        for name, shape, off, length in zip(self.names, self.shapes, self.offsets, lengths):
            if off < 0 or length < 0 or off + length > elements:
                raise ValueError(
                    f"bucket {self.index}: tensor {name!r} {shape} at element {off} overruns "
                    f"{self.nbytes} payload bytes"
                )


def _numel(shape: list[int] | tuple[int, ...]) -> int:
    numel = 1
    for s in shape:
        numel *= int(s)
    return numel


PATCH_BLOCK = 1 << 16  # elements per block of a patched tensor: offsets inside a block fit uint16


def _pad8(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


def _blocks(shape) -> int:
    return -(-_numel(shape) // PATCH_BLOCK)


def patch_nbytes(elements: int, itemsize: int, blocks: int) -> int:
    """Payload bytes of a patch bucket holding ``elements`` changed elements of ``itemsize`` bytes in
    tensors of ``blocks`` blocks in all: int32 block counts, uint16 offsets, values (each padded to 8)."""
    return _pad8(4 * blocks) + _pad8(2 * elements) + elements * itemsize


@dataclass
class Bucket:
    header: BucketHeader
    payload: torch.Tensor  # uint8, 1-D, contiguous, exactly header.nbytes long


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _runs(items: Iterable, bucket_bytes: int, key: Callable) -> Iterator[tuple[str, list]]:
    """Group ``items`` by dtype into runs of at most ``bucket_bytes`` (an item larger than that gets a
    run of its own), lazily: a run is yielded as soon as the next item of its dtype would overflow it,
    the rest at the end. ``key(item) -> (dtype name, bytes)``."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    pending: dict[str, list] = {}
    size: dict[str, int] = {}
    for item in items:
        dt, nb = key(item)
        if pending.get(dt) and size[dt] + nb > bucket_bytes:
            yield dt, pending.pop(dt)
        if dt not in pending:
            pending[dt], size[dt] = [], 0
        pending[dt].append(item)
        size[dt] += nb
    yield from pending.items()


def _numbered(buckets: Iterator[Bucket], version: int, seq: int) -> Iterator[Bucket]:
    """Stamps version, seq and index on each bucket and flags the final one ``last`` (an empty bucket
    stands in when there is none)."""
    prev, index = None, 0
    for b in buckets:
        if prev is not None:
            yield prev
        b.header.version, b.header.seq, b.header.index = version, seq, index
        prev, index = b, index + 1
    if prev is None:
        prev = Bucket(BucketHeader(version=version, seq=seq, index=0, dtype="uint8"), torch.empty(0, dtype=torch.uint8))
    prev.header.last = True
    yield prev


def _once(items: Iterable, name_of: Callable) -> Iterator:
    """``items`` passed through lazily, raising on a name seen before."""
    seen: set[str] = set()
    for item in items:
        name = name_of(item)
        if name in seen:
            raise ValueError(f"parameter {name!r} sent twice in one push")
        seen.add(name)
        yield item


def _dense_key(item: tuple[str, torch.Tensor]) -> tuple[str, int]:
    name, t = item
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name!r}: expected a torch.Tensor, got {type(t).__name__}")
    return dtype_name(t.dtype), t.numel() * t.element_size()


def _dense_bucket(dt: str, items: list[tuple[str, torch.Tensor]]) -> Bucket:
    itemsize = torch.empty((), dtype=dtype_from_name(dt)).element_size()
    total = sum(t.numel() for _, t in items) * itemsize
    payload = torch.empty(total, dtype=torch.uint8)
    hdr = BucketHeader(version=0, seq=0, index=0, dtype=dt, nbytes=total)
    pos = 0
    for name, t in items:
        nb = t.numel() * itemsize
        payload[pos : pos + nb].copy_(_as_bytes(t))  # also moves a device tensor to the CPU
        hdr.names.append(name)
        hdr.shapes.append(list(t.shape))
        hdr.offsets.append(pos // itemsize)
        pos += nb
    return Bucket(hdr, payload)


def pack_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, *, version: int = 0, seq: int = 0
) -> Iterator[Bucket]:
    """Stream ``named_tensors`` into per-dtype buckets of at most ``bucket_bytes`` (a tensor larger than
    that gets a bucket of its own), consuming the input lazily. The final bucket yielded has
    ``header.last = True`` (an empty one is emitted if the input was empty). Names must be unique."""
    runs = _runs(_once(named_tensors, lambda item: item[0]), bucket_bytes, _dense_key)
    yield from _numbered((_dense_bucket(dt, run) for dt, run in runs), version, seq)


def _patch_key(patch: Patch) -> tuple[str, int]:
    if patch.indices.dtype != torch.int32 or patch.indices.shape != patch.values.shape or patch.values.dim() != 1:
        raise ValueError(f"patch {patch.name!r}: needs 1-D int32 indices and values of the same length, got "
                         f"{patch.indices.dtype} {tuple(patch.indices.shape)} / {tuple(patch.values.shape)}")
    return dtype_name(patch.values.dtype), patch.values.numel() * (2 + patch.values.element_size())


def _sections(payload: torch.Tensor, dtype: torch.dtype, elements: int, blocks: int):
    """(int32 block counts, int16 offsets, values) views of a patch bucket's payload."""
    o = _pad8(4 * blocks)
    return (payload[: 4 * blocks].view(torch.int32), payload[o : o + 2 * elements].view(torch.int16),
            payload[o + _pad8(2 * elements) :].view(dtype))


def _patch_bucket(dt: str, patches: list[Patch]) -> Bucket:
    dtype = dtype_from_name(dt)
    itemsize = torch.empty((), dtype=dtype).element_size()
    elements = sum(p.values.numel() for p in patches)
    blocks = sum(_blocks(p.shape) for p in patches)
    payload = torch.zeros(patch_nbytes(elements, itemsize, blocks), dtype=torch.uint8)
    counts, offsets, values = _sections(payload, dtype, elements, blocks)
    hdr = BucketHeader(version=0, seq=0, index=0, dtype=dt, nbytes=payload.numel(), counts=[])
    pos = block = 0
    for p in patches:
        k, nb = p.values.numel(), _blocks(p.shape)
        idx = p.indices.long()
        counts[block : block + nb].copy_(torch.bincount(idx // PATCH_BLOCK, minlength=nb)[:nb])
        offsets[pos : pos + k].copy_((idx % PATCH_BLOCK).to(torch.int16))  # wraps: uint16 bits in an int16
        values[pos : pos + k].copy_(p.values)
        block += nb
        hdr.names.append(p.name)
        hdr.shapes.append([int(s) for s in p.shape])
        hdr.offsets.append(pos)
        hdr.counts.append(k)
        pos += k
    return Bucket(hdr, payload)


def pack_patch_buckets(patches: Iterable[Patch], bucket_bytes: int, *, version: int = 0,
                       seq: int = 0) -> Iterator[Bucket]:
    """Like ``pack_buckets``, for the sparse patches of a delta push (buckets grouped by value dtype;
    a patch counts 2 + itemsize bytes per changed element). Indices must be ascending (as
    ``weightsync.delta.diff`` makes them): a block's offsets are matched to it by position."""
    runs = _runs(_once(patches, lambda p: p.name), bucket_bytes, _patch_key)
    yield from _numbered((_patch_bucket(dt, run) for dt, run in runs), version, seq)


def _checked(header: BucketHeader, payload: torch.Tensor, patches: bool) -> torch.dtype:
    if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.numel() != header.nbytes:
        raise ValueError(
            f"bucket {header.index}: payload must be 1-D uint8 of {header.nbytes} bytes, "
            f"got {payload.dtype} {tuple(payload.shape)}"
        )
    if (header.counts is not None) != patches:
        raise ValueError(f"bucket {header.index}: expected a {'patch' if patches else 'dense'} bucket")
    header.validate()
    return dtype_from_name(header.dtype)


def unpack_bucket(header: BucketHeader, payload: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views into ``payload`` (no copy), one per tensor named in ``header``. The views keep the
    payload alive: callers that hand them to a loader which defers copying (vLLM's layerwise reload
    does) must not reuse the buffer."""
    dtype = _checked(header, payload, patches=False)
    flat = payload.view(dtype) if header.nbytes else torch.empty(0, dtype=dtype)
    return [(name, flat[off : off + _numel(shape)].view(shape))
            for name, shape, off in zip(header.names, header.shapes, header.offsets)]


def unpack_patch_bucket(header: BucketHeader,
                        payload: torch.Tensor) -> list[tuple[str, list[int], torch.Tensor, torch.Tensor]]:
    """``(name, full shape, int32 indices, values)`` per patch of a patch bucket (views into ``payload``)."""
    dtype = _checked(header, payload, patches=True)
    assert header.counts is not None
    nbs = [_blocks(s) for s in header.shapes]
    counts, offsets, values = _sections(payload, dtype, sum(header.counts), sum(nbs))
    out, block = [], 0
    for name, shape, off, k, nb in zip(header.names, header.shapes, header.offsets, header.counts, nbs):
        per_block = counts[block : block + nb].long()
        if int(per_block.sum()) != k or bool((per_block < 0).any()):
            raise ValueError(f"patch bucket {header.index}: the block counts of {name!r} do not add up to {k}")
        base = torch.repeat_interleave(torch.arange(nb, dtype=torch.long) * PATCH_BLOCK, per_block)
        indices = (base + (offsets[off : off + k].long() & 0xFFFF)).to(torch.int32)
        out.append((name, shape, indices, values[off : off + k]))
        block += nb
    return out
