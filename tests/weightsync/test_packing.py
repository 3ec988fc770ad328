"""Bucket packing round trip: names, shapes, dtypes and values survive; buckets respect the size cap."""

import pytest
import torch

from weightsync.packing import Bucket, BucketHeader, pack_buckets, unpack_bucket


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


def test_cast_dtype_only_touches_floats():
    buckets = list(pack_buckets(_named(), 1 << 20, cast_dtype=torch.bfloat16))
    got = _roundtrip(buckets)
    assert got["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert got["ids"].dtype == torch.int64 and got["mask"].dtype == torch.bool
    ref = dict(_named())["model.embed_tokens.weight"].to(torch.bfloat16)
    assert torch.equal(got["model.embed_tokens.weight"], ref)


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
