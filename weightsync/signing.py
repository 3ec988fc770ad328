"""Signed (and sealed) values on the weight-sync store: only a holder of the run's key can write a value
that a run member accepts, or read a group value (torch + stdlib only; both ends use it).

Why: a ``TCPStore`` has no access control. Anyone who reaches its port may list every key
(``list_keys``), read every value and overwrite any of them. So the store is treated as a public
bulletin board: a run member accepts a value only with a valid tag from the group's key, and the
group's values are encrypted as well, so that what a stranger reads (the data plane's init info, a
rendezvous address, an NCCL unique id) is worth nothing to it.

- ``group_key(token, nonce)``: the key of one sender's group, HMAC-SHA256 of the run's
  ``RunSecrets.weight_sync_token`` over "sign/<nonce>" (a fresh nonce per sender); no key name or
  value on the store is derived from it.
- ``sign(key, ns, name, value)`` -> ``b"ws1:" + tag + b":" + value``; tag = hex HMAC-SHA256(key,
  "ws1" ns name value) (each field length-prefixed): bound to the store (``ns``: "root", or the group
  prefix) and the key name, so a value copied to another key (a replay) is refused like a forgery.
- ``seal(key, ns, name, value)``: encrypt-then-MAC, ``b"ws1s:" + iv + ":" + tag + ":" + ciphertext``;
  the keystream is HMAC-SHA256(key', iv || counter) (a PRF in counter mode, a fresh random iv per
  value); the tag covers iv and ciphertext.
- ``SignedStore(inner, key, ns, seal=...)``: a ``dist.Store`` that signs (seals) what it sets and checks
  what it gets. A value without a valid tag is *as good as absent*: ``check`` says False, ``wait``
  keeps waiting for a valid one (until its timeout), ``get`` raises ``ForgedValue``, and the forgery
  is counted once per distinct (key, value) in ``Forgeries`` (polling the same forged value again does
  not count it again). ``add`` (the protocol's counters: tickets, outcomes, heartbeats, progress)
  cannot be signed and passes through: a stranger can bump a counter, which wakes a waiter early or
  late but never makes it accept a value. Works under ``dist.PrefixStore`` and as the store of a
  ``ProcessGroupGloo`` (whose rendezvous keys are then signed and sealed too).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from datetime import timedelta

import torch.distributed as dist

logger = logging.getLogger(__name__)

SIGNED, SEALED = b"ws1:", b"ws1s:"
_TAG_HEX = 64
_IV_HEX = 32
_POLL_S = 0.05


class ForgedValue(dist.DistStoreError):
    """A store value without a valid tag from the group's key (written by someone outside the run, or
    copied from another key). A ``DistStoreError``: callers treat it like a missing key."""


def group_key(token: str, nonce: str) -> bytes:
    """The signing key of the group of the sender with ``nonce`` (32 bytes)."""
    return hmac.new(token.encode(), f"sign/{nonce}".encode(), hashlib.sha256).digest()


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):  # pybind may hand a std::vector<uint8_t> over as a list of ints
        return bytes(value)
    return str(value).encode()


def _tag(key: bytes, *fields: bytes) -> str:
    mac = hmac.new(key, b"ws1", hashlib.sha256)
    for f in fields:
        mac.update(len(f).to_bytes(8, "big"))
        mac.update(f)
    return mac.hexdigest()


def sign(key: bytes, ns: str, name: str, value) -> bytes:
    value = _as_bytes(value)
    return SIGNED + _tag(key, ns.encode(), name.encode(), value).encode() + b":" + value


def _keystream(key: bytes, iv: bytes, n: int) -> bytes:
    enc = hmac.new(key, b"ws1-enc", hashlib.sha256).digest()
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hmac.new(enc, iv + counter.to_bytes(8, "big"), hashlib.sha256).digest()
        counter += 1
    return bytes(out[:n])


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(len(a), "big") if a else b""


def seal(key: bytes, ns: str, name: str, value) -> bytes:
    value = _as_bytes(value)
    iv = os.urandom(_IV_HEX // 2)
    ct = _xor(value, _keystream(key, iv, len(value)))
    return SEALED + iv.hex().encode() + b":" + _tag(key, ns.encode(), name.encode(), iv, ct).encode() + b":" + ct


def open_value(key: bytes, ns: str, name: str, blob) -> bytes | None:
    """The value inside ``blob`` (signed or sealed) when its tag is valid for (``ns``, ``name``), else None."""
    blob = _as_bytes(blob)
    if blob.startswith(SIGNED):
        tag, value = blob[len(SIGNED):len(SIGNED) + _TAG_HEX], blob[len(SIGNED) + _TAG_HEX + 1:]
        good = _tag(key, ns.encode(), name.encode(), value).encode()
        return value if len(blob) > len(SIGNED) + _TAG_HEX and hmac.compare_digest(tag, good) else None
    if blob.startswith(SEALED):
        rest = blob[len(SEALED):]
        try:
            iv = bytes.fromhex(rest[:_IV_HEX].decode())
        except ValueError:
            return None
        tag, ct = rest[_IV_HEX + 1:_IV_HEX + 1 + _TAG_HEX], rest[_IV_HEX + 2 + _TAG_HEX:]
        if len(rest) < _IV_HEX + 2 + _TAG_HEX:
            return None
        if not hmac.compare_digest(tag, _tag(key, ns.encode(), name.encode(), iv, ct).encode()):
            return None
        return _xor(ct, _keystream(key, iv, len(ct)))
    return None


class Forgeries:
    """Distinct forged values refused by the stores that share this counter (thread-safe)."""

    def __init__(self):
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()

    def record(self, ns: str, name: str, blob: bytes) -> bool:
        """Count (``ns``, ``name``, ``blob``) once; True the first time it is seen."""
        digest = hashlib.sha256(ns.encode() + b"\0" + name.encode() + b"\0" + blob).digest()
        with self._lock:
            if digest in self._seen:
                return False
            self._seen.add(digest)
            return True

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._seen)


class SignedStore(dist.Store):
    """``inner`` with every value signed (``seal=True``: sealed) with ``key`` under namespace ``ns``;
    see the module docstring. ``handle``: what a member process needs to open the same view of the
    group (``protocol.group_store``); it holds the key, so it is handed over in process arguments only,
    never written to the store."""

    def __init__(self, inner: dist.Store, key: bytes, ns: str, *, seal: bool = False,
                 forgeries: Forgeries | None = None, handle: str | None = None):
        super().__init__()
        self.inner, self._key, self.ns, self._seal = inner, key, ns, seal
        self.forgeries = forgeries if forgeries is not None else Forgeries()
        self.handle = handle
        self._timeout = timedelta(seconds=300)

    # -- values
    def set(self, key: str, value) -> None:
        wrap = seal if self._seal else sign
        self.inner.set(key, wrap(self._key, self.ns, key, value))

    def _open(self, key: str, blob) -> bytes | None:
        value = open_value(self._key, self.ns, key, blob)
        if value is None:
            blob = _as_bytes(blob)
            if self.forgeries.record(self.ns, key, blob):
                logger.warning("weight sync: refused a value of %r not written by a run member (%d bytes; "
                               "%d forged value(s) so far)", key, len(blob), self.forgeries.count)
        return value

    def get(self, key: str) -> bytes:
        value = self._open(key, self.inner.get(key))
        if value is None:
            raise ForgedValue(f"weight-sync store: the value of {key!r} is not signed by this run (refused)")
        return value

    def check(self, keys: list[str]) -> bool:
        if not self.inner.check(keys):
            return False
        return all(self._open(k, self.inner.get(k)) is not None for k in keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        budget = (timeout if timeout is not None else self._timeout).total_seconds()
        deadline = time.monotonic() + budget
        self.inner.wait(keys, timedelta(seconds=max(budget, 0.001)))
        while not self.check(keys):  # present but forged: wait for a member's value
            if time.monotonic() > deadline:
                raise dist.DistStoreError(f"wait timeout after {budget * 1000:.0f}ms: no value of {keys} signed "
                                          "by this run (only forged ones)")
            time.sleep(_POLL_S)

    # -- pass-through
    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout
        self.inner.set_timeout(timeout)
