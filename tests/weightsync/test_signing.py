"""Signed weight-sync store values (issue 23 item 1): a value a run member did not write is refused and
counted, a value copied from another key is refused, a group value is unreadable without the key, and
nothing the store lists or serves carries the run's secret. The store listens on its host only."""

from __future__ import annotations

import time
from datetime import timedelta

import psutil
import pytest
import torch
import torch.distributed as dist

from tests.weightsync.plain_procs import start_plain_receivers, stop
from weightsync import WeightSender, signing
from weightsync.protocol import connect_store, group_handle, group_store, serve_store
from weightsync.signing import (
    SEAL_INFO,
    SEALED,
    ForgedValue,
    Forgeries,
    SignedStore,
    group_key,
    open_value,
    seal,
    seal_key,
    sign,
)

TOKEN = "d5" * 32
KEY = group_key(TOKEN, "nonce-1")


def test_a_signed_value_opens_only_with_its_key_namespace_and_name():
    blob = sign(KEY, "root", "push/1", b'{"version": 3}')
    assert open_value(KEY, "root", "push/1", blob) == b'{"version": 3}'
    assert open_value(group_key(TOKEN, "nonce-2"), "root", "push/1", blob) is None  # another sender's key
    assert open_value(group_key("e6" * 32, "nonce-1"), "root", "push/1", blob) is None  # another run's token
    assert open_value(KEY, "root", "push/2", blob) is None  # replayed under another key
    assert open_value(KEY, "group/x", "push/1", blob) is None  # replayed in another namespace
    assert open_value(KEY, "root", "push/1", blob.replace(b"3", b"4")) is None  # tampered
    assert open_value(KEY, "root", "push/1", b'{"version": 3}') is None  # unsigned


def test_a_sealed_value_hides_its_content():
    secret = b'{"nccl_unique_id_b64": "c2VjcmV0LWlk", "port": 4242}'
    blob = seal(KEY, "group/x", "plane/1", secret)
    assert b"c2VjcmV0LWlk" not in blob and b"4242" not in blob
    assert open_value(KEY, "group/x", "plane/1", blob) == secret
    assert open_value(KEY, "group/x", "plane/2", blob) is None
    assert seal(KEY, "group/x", "plane/1", secret) != blob  # a fresh nonce every time


def test_a_sealed_value_is_aes_gcm_under_a_derived_key_with_its_name_as_associated_data():
    """Issue 32 item 5: the seal is the standard AEAD, opened here with ``cryptography`` alone; the sealing
    key is HKDF-SHA256(group key, SEAL_INFO), not the signing key; the AD is (ns, name), each field an
    8-byte big-endian length then its bytes."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    secret = b'{"port": 4242}'
    blob = seal(KEY, "group/x", "plane/1", secret)
    assert blob.startswith(SEALED) and len(blob) == len(SEALED) + 12 + len(secret) + 16  # nonce, ct, GCM tag
    aes_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=SEAL_INFO).derive(KEY)
    assert seal_key(KEY) == aes_key != KEY
    aad = (7).to_bytes(8, "big") + b"group/x" + (7).to_bytes(8, "big") + b"plane/1"
    nonce, ct = blob[len(SEALED):len(SEALED) + 12], blob[len(SEALED) + 12:]
    assert AESGCM(aes_key).decrypt(nonce, ct, aad) == secret
    assert not hasattr(signing, "_keystream") and not hasattr(signing, "_xor")  # the home-made cipher is gone


def _flip(blob: bytes, i: int) -> bytes:
    return blob[:i] + bytes([blob[i] ^ 1]) + blob[i + 1:]


def test_a_tampered_or_moved_sealed_value_is_refused():
    secret = b'{"nccl_unique_id_b64": "c2VjcmV0LWlk"}'
    blob = seal(KEY, "group/x", "plane/1", secret)
    start = len(SEALED)
    assert open_value(KEY, "group/x", "plane/1", _flip(blob, start)) is None  # nonce
    assert open_value(KEY, "group/x", "plane/1", _flip(blob, start + 12)) is None  # ciphertext
    assert open_value(KEY, "group/x", "plane/1", _flip(blob, len(blob) - 1)) is None  # GCM tag
    assert open_value(KEY, "group/x", "plane/1", blob[:-1]) is None  # truncated
    assert open_value(KEY, "group/x", "plane/1", blob[:start + 27]) is None  # shorter than nonce + tag
    assert open_value(KEY, "group/x", "rank/1", blob) is None  # moved to another key name (the AD)
    assert open_value(KEY, "group/y", "plane/1", blob) is None  # moved to another group (the AD)
    assert open_value(group_key(TOKEN, "nonce-2"), "group/x", "plane/1", blob) is None  # another sender's key
    old_format = b"ws1s:" + b"00" * 16 + b":" + b"0" * 64 + b":" + secret  # the retired cipher's layout
    assert open_value(KEY, "group/x", "plane/1", old_format) is None


@pytest.fixture
def store():
    server = serve_store("127.0.0.1", 0, 30)
    yield server
    del server


def test_a_forged_value_is_as_good_as_absent_and_counted_once(store):
    forgeries = Forgeries()
    member = SignedStore(store, KEY, "root", forgeries=forgeries)
    stranger = connect_store("127.0.0.1", store.port, 30)
    stranger.set("abort/1", "stop now")
    assert not member.check(["abort/1"])  # a forged abort is never seen
    assert not member.check(["abort/1"])
    with pytest.raises(ForgedValue):
        member.get("abort/1")
    assert forgeries.count == 1  # polled three times, counted once
    with pytest.raises(dist.DistStoreError):
        member.wait(["abort/1"], timedelta(seconds=0.3))  # waits for a member's value, not the forgery
    member.set("push/1", b'{"version": 1}')
    stranger.set("push/2", stranger.get("push/1"))  # a replay of a genuine value under another key
    assert member.get("push/1") == b'{"version": 1}' and not member.check(["push/2"])
    assert forgeries.count == 2
    member.set("abort/1", "genuine")  # a member's write replaces the forgery
    member.wait(["abort/1"], timedelta(seconds=5))
    assert member.get("abort/1") == b"genuine"


def test_store_listens_on_its_host_only(store):
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert ("127.0.0.1", store.port) in listening
    assert ("0.0.0.0", store.port) not in listening and ("::", store.port) not in listening


def test_a_gloo_group_rendezvous_over_the_signed_store(store):
    """gloo's own rendezvous keys go through the signed, sealed group store (a Python dist.Store)."""
    import threading

    from weightsync.gloo.group import new_gloo_group

    handle = group_handle("group/t", KEY)
    out = {}

    def member(rank):
        g = group_store(connect_store("127.0.0.1", store.port, 30), handle)
        pg = new_gloo_group(g, rank, 2, 30, local_host="127.0.0.1")
        t = torch.tensor([float(rank + 7)])
        pg.broadcast(t, 0).wait()
        out[rank] = t.item()

    threads = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out == {0: 7.0, 1: 7.0}
    raw = connect_store("127.0.0.1", store.port, 30)
    gloo_keys = [k for k in raw.list_keys() if k.startswith("group/t/")]
    assert gloo_keys and all(raw.get(k).startswith(SEALED) for k in gloo_keys)  # sealed


def test_a_stranger_on_the_store_reads_no_secret_and_its_writes_are_not_acted_on():
    sender = WeightSender(1, bucket_mb=0.01, timeout_s=30, connect_timeout_s=120, token=TOKEN)
    procs = start_plain_receivers(sender.address, ["rx"], token=TOKEN, pushes=2, checksum=True)
    try:
        sender.connect()
        stranger = connect_store(*sender.address, 30)
        keys = stranger.list_keys()
        values = {k: stranger.get(k) for k in keys if not k.startswith(("tickets", "hb/", "outcomes/"))}
        key_hex = group_key(TOKEN, sender._nonce).hex().encode()
        assert not [k for k in keys if TOKEN in k or key_hex.decode() in k]
        assert not [k for k, v in values.items() if TOKEN.encode() in v or key_hex in v]
        plane = next(k for k in keys if k.endswith("/plane/1"))
        assert b'"port"' not in values[plane]  # the data plane's init info is sealed
        prefix = plane.removesuffix("plane/1")
        stranger.set(prefix + "abort/1", "forged abort")  # would stop the receiver's first push
        stranger.set(prefix + "push/1", '{"version": 666, "info": {}}')  # a forged announcement
        time.sleep(0.5)
        w = [(f"w{i}", torch.full((8, 8), float(i))) for i in range(3)]
        stats = sender.push(iter(w), version=5)  # the sender's own push/1 replaces the forged one
        assert stats["acks"] == {"rx": "5"} and stats["ack_info"]["rx"]["checksum"] == 64.0 * 3
        stranger.set(prefix + "ack/2/1", '{"version": 6}')  # a forged ack of the next push
        ticket = stranger.add("tickets", 1)  # and a seat asked for with a hello it cannot sign
        stranger.set(f"hello/{ticket}", '{"name": "rx", "proof": "00"}')
        stats = sender.push(iter(w), version=6)
        assert stats["acks"] == {"rx": "6"}
        assert stats["refused_peers"] == 1 and stats["refused"] == stats["forged"] + 1, stats
        assert procs[0].wait(timeout=30) == 0, procs[0].stderr.read().decode()[-2000:]
    finally:
        stop(procs)
        sender.close()
