"""Signed (and sealed) values on the weight-sync store: only a holder of the run's key can write a value
that a run member accepts, or read a group value (torch, stdlib and ``cryptography``; both ends use it).

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
  Root values are signed, not sealed: a peer must read ``config`` (its nonce) before it holds a key.
- ``seal(key, ns, name, value)`` -> ``b"ws2s:" + nonce + ciphertext``: AES-256-GCM (``cryptography``'s
  ``AESGCM``; a standard AEAD rather than a cipher written here, so a security review has nothing
  home-made to check) under a sealing key derived from the group key with HKDF-SHA256 (info
  ``SEAL_INFO``, so it differs from the signing key), a fresh random 96-bit nonce per value, and the
  associated data (``ns``, ``name``, length-prefixed as for ``sign``) binding the value to its store
  and key name: GCM's 16-byte tag (the ciphertext's last bytes) refuses a tampered nonce, ciphertext or
  tag, and a value moved to another key or namespace. The group's values (``SignedStore(seal=True)``)
  are sealed.
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
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

logger = logging.getLogger(__name__)

SIGNED, SEALED = b"ws1:", b"ws2s:"
SEAL_INFO = b"impala-lm weight-sync seal v2"  # HKDF label of the sealing key (never used for signing)
_TAG_HEX = 64
_NONCE_BYTES = 12  # GCM's 96-bit nonce
_GCM_TAG_BYTES = 16
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


def _fields(*fields: bytes) -> bytes:
    return b"".join(len(f).to_bytes(8, "big") + f for f in fields)


def _tag(key: bytes, *fields: bytes) -> str:
    return hmac.new(key, b"ws1" + _fields(*fields), hashlib.sha256).hexdigest()


def sign(key: bytes, ns: str, name: str, value) -> bytes:
    value = _as_bytes(value)
    return SIGNED + _tag(key, ns.encode(), name.encode(), value).encode() + b":" + value


def seal_key(key: bytes) -> bytes:
    """The AES-256 key that seals the values of the group with signing key ``key`` (HKDF-SHA256)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=SEAL_INFO).derive(key)


def _aad(ns: str, name: str) -> bytes:
    return _fields(ns.encode(), name.encode())


def seal(key: bytes, ns: str, name: str, value) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return SEALED + nonce + AESGCM(seal_key(key)).encrypt(nonce, _as_bytes(value), _aad(ns, name))


def open_value(key: bytes, ns: str, name: str, blob) -> bytes | None:
    """The value inside ``blob`` (signed or sealed) when its tag is valid for (``ns``, ``name``), else None."""
    blob = _as_bytes(blob)
    if blob.startswith(SIGNED):
        tag, value = blob[len(SIGNED):len(SIGNED) + _TAG_HEX], blob[len(SIGNED) + _TAG_HEX + 1:]
        good = _tag(key, ns.encode(), name.encode(), value).encode()
        return value if len(blob) > len(SIGNED) + _TAG_HEX and hmac.compare_digest(tag, good) else None
    if blob.startswith(SEALED) and len(blob) >= len(SEALED) + _NONCE_BYTES + _GCM_TAG_BYTES:
        nonce, ct = blob[len(SEALED):len(SEALED) + _NONCE_BYTES], blob[len(SEALED) + _NONCE_BYTES:]
        try:
            return AESGCM(seal_key(key)).decrypt(nonce, ct, _aad(ns, name))
        except InvalidTag:
            return None
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
