"""Bucket packing round trip (dense tensors and delta patches): names, shapes, dtypes and values survive;
buckets respect the size cap."""

import pytest
import torch

from weightsync.packing import (
    Bucket,
    BucketHeader,
    Patch,
    pack_buckets,
    pack_patch_buckets,
    patch_nbytes,
    unpack_bucket,
    unpack_patch_bucket,
)
from weightsync.sender import wire_tensor


def _named(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("model.embed_tokens.weight", torch.randn(64, 16, generator=g)),
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(16, 16, generator=g).to(torch.bfloat16)),
        ("model.layers.0.input_layernorm.weight", torch.randn(16, generator=g)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(32, 16, generator=g).to(torch.bfloat16)),
        ("scalar", torch.tensor(3.5)),
        ("empty", torch.empty(0, 4)),
        ("ids", torch.arange(7, dtype=torch.int64)),
        ("mask", torch.tensor([True, False, True])),
        ("strided", torch.randn(8, 6, generator=g).t()),  # non-contiguous view
    ]


def _roundtrip(buckets: list[Bucket]) -> dict[str, torch.Tensor]:
    out = {}
    for b in buckets:
        hdr = BucketHeader.decode(b.header.encode())  # through the wire encoding
        payload = torch.frombuffer(bytearray(b.payload.numpy().tobytes()), dtype=torch.uint8) \
            if b.payload.numel() else torch.empty(0, dtype=torch.uint8)
        for name, t in unpack_bucket(hdr, payload):
            assert name not in out
            out[name] = t
    return out


@pytest.mark.parametrize("bucket_bytes", [1, 100, 1000, 1 << 20])
def test_roundtrip_preserves_everything(bucket_bytes):
    named = _named()
    buckets = list(pack_buckets(iter(named), bucket_bytes, version=5, seq=2))
    got = _roundtrip(buckets)
    assert list(got) != [] and set(got) == {n for n, _ in named}
    for name, t in named:
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name
    assert [b.header.last for b in buckets] == [False] * (len(buckets) - 1) + [True]
    assert [b.header.index for b in buckets] == list(range(len(buckets)))
    assert all((b.header.version, b.header.seq) == (5, 2) for b in buckets)
    for b in buckets:  # one dtype per bucket, cap respected unless a single tensor exceeds it
        assert b.payload.numel() == b.header.nbytes
        assert b.header.nbytes <= bucket_bytes or len(b.header.names) == 1


def test_large_cap_packs_one_bucket_per_dtype():
    buckets = list(pack_buckets(_named(), 1 << 20))
    dtypes = [b.header.dtype for b in buckets]
    assert sorted(dtypes) == sorted({"float32", "bfloat16", "int64", "bool"})


def test_wire_cast_only_touches_floats():
    buckets = list(pack_buckets([(n, wire_tensor(t, torch.bfloat16)) for n, t in _named()], 1 << 20))
    got = _roundtrip(buckets)
    assert got["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert got["ids"].dtype == torch.int64 and got["mask"].dtype == torch.bool
    ref = dict(_named())["model.embed_tokens.weight"].to(torch.bfloat16)
    assert torch.equal(got["model.embed_tokens.weight"], ref)


def _patches() -> list[Patch]:
    bf = torch.bfloat16
    return [Patch("a", torch.tensor([0, 5], dtype=torch.int32), torch.tensor([1.5, -2.0], dtype=bf), (2, 3)),
            Patch("b", torch.tensor([3], dtype=torch.int32), torch.tensor([7.25]), (4,)),
            Patch("c", torch.tensor([1], dtype=torch.int32), torch.tensor([0.5], dtype=bf), (3,))]


@pytest.mark.parametrize("bucket_bytes", [1, 1 << 20])
def test_patch_buckets_roundtrip(bucket_bytes):
    buckets = list(pack_patch_buckets(_patches(), bucket_bytes, version=4, seq=3))
    got = {}
    for b in buckets:
        hdr = BucketHeader.decode(b.header.encode())
        for name, shape, idx, values in unpack_patch_bucket(hdr, b.payload.clone()):
            got[name] = (tuple(shape), idx.tolist(), values.dtype, values.tolist())
    assert got == {"a": ((2, 3), [0, 5], torch.bfloat16, [1.5, -2.0]), "b": ((4,), [3], torch.float32, [7.25]),
                   "c": ((3,), [1], torch.bfloat16, [0.5])}
    assert [b.header.last for b in buckets] == [False] * (len(buckets) - 1) + [True]
    assert all((b.header.version, b.header.seq) == (4, 3) for b in buckets)
    if bucket_bytes > 1:
        # one bucket per value dtype; bf16 ("a" and "c", one 65536-element block each): 2 block counts x
        # 4 B = 8 B, 3 uint16 offsets = 6 B padded to 8, 3 values x 2 B = 6 B -> 22 B;
        # fp32 ("b"): 1 block count 4 B -> 8, 1 offset 2 B -> 8, 1 value 4 B -> 20 B
        assert {b.header.dtype: b.header.nbytes for b in buckets} == {"bfloat16": 22, "float32": 20}
        assert patch_nbytes(3, 2, 2) == 22 and patch_nbytes(1, 4, 1) == 20
    else:
        assert len(buckets) == 3  # every patch alone: 4 B or 6 B per element > 1 B cap


def test_patch_indices_travel_as_block_offsets():
    # 200000 elements = 4 blocks of 65536 (the last one partial); indices in blocks 0, 0, 1, 2, 3
    idx = torch.tensor([1, 65535, 65536, 131073, 199999], dtype=torch.int32)
    patch = Patch("w", idx, torch.arange(5, dtype=torch.bfloat16), (400, 500))
    (b,) = pack_patch_buckets([patch], 1 << 20)
    counts = b.payload[:16].view(torch.int32).tolist()
    offsets = (b.payload[16:26].view(torch.int16).long() & 0xFFFF).tolist()
    assert counts == [2, 1, 1, 1]
    assert offsets == [1, 65535, 0, 1, 199999 - 3 * 65536]  # = 3391
    assert b.header.nbytes == 16 + 16 + 10  # 4 counts x 4 B; 5 offsets x 2 B -> 16; 5 bf16 values
    ((_, _, got, values),) = unpack_patch_bucket(BucketHeader.decode(b.header.encode()), b.payload)
    assert got.tolist() == idx.tolist() and got.dtype == torch.int32 and values.tolist() == [0, 1, 2, 3, 4]
    b.payload[:4].view(torch.int32)[0] = 3  # block counts no longer add up to the entry's count
    with pytest.raises(ValueError, match="block counts of 'w' do not add up to 5"):
        unpack_patch_bucket(b.header, b.payload)


def test_patch_and_dense_buckets_are_not_confused():
    patch = next(pack_patch_buckets(_patches(), 1 << 20))
    with pytest.raises(ValueError, match="expected a dense bucket"):
        unpack_bucket(patch.header, patch.payload)
    dense = next(pack_buckets(_named(), 1 << 20))
    with pytest.raises(ValueError, match="expected a patch bucket"):
        unpack_patch_bucket(dense.header, dense.payload)
    patch.header.counts[0] += 1  # claims more elements than the payload holds
    with pytest.raises(ValueError, match="need"):
        BucketHeader.decode(patch.header.encode())


def test_empty_input_yields_one_last_bucket():
    buckets = list(pack_buckets([], 1024))
    assert len(buckets) == 1 and buckets[0].header.last and buckets[0].header.names == []
    assert _roundtrip(buckets) == {}


def test_duplicate_names_rejected():
    t = torch.zeros(2)
    with pytest.raises(ValueError, match="twice"):
        list(pack_buckets([("a", t), ("a", t)], 1024))


def test_corrupt_header_rejected():
    b = next(pack_buckets([("a", torch.zeros(4)), ("b", torch.zeros(4))], 1 << 20))
    b.header.offsets[1] = 5  # elements 5..8 would overrun the 32-byte payload
    with pytest.raises(ValueError, match="overruns"):
        BucketHeader.decode(b.header.encode())
    with pytest.raises(ValueError, match="payload must be"):
        good = next(pack_buckets([("a", torch.zeros(4))], 1 << 20))
        unpack_bucket(good.header, good.payload[:-1])
