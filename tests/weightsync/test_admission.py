"""Who may join the weight-sync group: only peers that prove the run's token get a seat and the
weights; strangers (wrong token, no token, garbage) are refused, counted in the push stats, and the
push to the legitimate receivers completes. The sender advertises, and its gloo end binds, the host
it was given."""

import time

import psutil
import pytest
import torch

from tests.weightsync.plain_procs import start_plain_receivers, stop
from weightsync import WeightSender
from weightsync.protocol import (
    TICKETS,
    admission_proof,
    connect_store,
    get_json,
    key_admit,
    key_hello,
    key_push,
    read_config,
    set_json,
    signed_root,
)

TOKEN = "c3" * 32
WRONG = "c4" * 32


@pytest.fixture
def procs():
    started: list = []
    yield started
    stop(started)


def _weights() -> list[tuple[str, torch.Tensor]]:
    return [(f"w{i}", torch.full((64, 64), float(i))) for i in range(4)]


class RawPeer:
    """A client that speaks the store protocol by hand (what a stranger on the network can do)."""

    def __init__(self, address: tuple[str, int]):
        self.root = connect_store(*address, 30)
        self.nonce = read_config(self.root, TOKEN)["nonce"]  # the config is signed: checked with the run's token
        self.ticket = self.root.add(TICKETS, 1)

    def say(self, raw: bytes) -> None:
        self.root.set(key_hello(self.ticket), raw)

    def verdict(self) -> dict:
        """The sender's (signed) verdict on this peer's ticket; {} while there is none."""
        return get_json(signed_root(self.root, TOKEN, self.nonce), key_admit(self.ticket)) \
            if self.root.check([key_admit(self.ticket)]) else {}


def _screen_until(sender: WeightSender, done, what: str) -> None:
    deadline = time.monotonic() + 120
    while not done():
        assert time.monotonic() < deadline, what
        sender.registered()  # answers pending hellos
        time.sleep(0.05)


def test_strangers_are_refused_and_counted_while_the_push_reaches_the_receivers(procs):
    sender = WeightSender(2, bucket_mb=0.01, timeout_s=30, connect_timeout_s=120, token=TOKEN)
    garbage = RawPeer(sender.address)  # draws ticket 1 before anyone else: seats are not handed out by ticket
    garbage.say(b"\xff not json")
    procs += start_plain_receivers(sender.address, ["stranger"], token=WRONG)
    procs += start_plain_receivers(sender.address, ["rx-a", "rx-b"], token=TOKEN, pushes=2, checksum=True)
    sender.connect()
    assert sorted(info["name"] for info in sender.receivers.values()) == ["rx-a", "rx-b"]
    stranger = procs[0]
    _screen_until(sender, lambda: stranger.poll() is not None, "the stranger was never answered")
    assert stranger.returncode != 0
    assert "refused us: wrong weight-sync token" in stranger.stderr.read().decode()
    assert garbage.verdict() == {"error": "wrong weight-sync token"}

    stats = sender.push(iter(_weights()), version=7)
    assert stats["acks"] == {"rx-a": "7", "rx-b": "7"}
    # 64*64 values of 0, 1, 2, 3: 4096 * (0 + 1 + 2 + 3) = 24576
    assert {n: a["checksum"] for n, a in stats["ack_info"].items()} == {"rx-a": 24576.0, "rx-b": 24576.0}
    assert stats["refused"] == 2  # the garbage hello and the wrong token
    assert not garbage.root.check([key_push(1)])  # the group's keys are not where a stranger can look

    # A late peer that does prove the token gets no seat either: the group is formed.
    late = RawPeer(sender.address)
    set_json(signed_root(late.root, TOKEN, late.nonce), key_hello(late.ticket),
             {"name": "late", "proof": admission_proof(TOKEN, late.nonce, late.ticket)})
    assert sender.push(iter(_weights()), version=8)["refused"] == 3
    assert late.verdict() == {"error": "all 2 receiver seats are taken"}
    for p in procs[1:]:
        assert p.wait(timeout=30) == 0, p.stderr.read().decode()[-2000:]


def test_a_proof_is_bound_to_its_ticket(procs):
    """A stranger that copies a legitimate receiver's hello (proof included) under its own ticket is
    refused: HMAC(token, "hello/<nonce>/<ticket>") differs per ticket."""
    sender = WeightSender(1, timeout_s=30, connect_timeout_s=120, token=TOKEN)
    procs += start_plain_receivers(sender.address, ["rx"], token=TOKEN)
    thief = RawPeer(sender.address)
    _screen_until(sender, lambda: sender.registered() == [1], "the receiver was never admitted")
    legit = next(t for t in (1, 2) if t != thief.ticket)
    thief.say(thief.root.get(key_hello(legit)))
    _screen_until(sender, lambda: thief.verdict() != {}, "the copied hello was never answered")
    assert thief.verdict() == {"error": "wrong weight-sync token"} and sender.refused == 1


def test_sender_advertises_and_binds_the_host_it_was_given(procs):
    host = "127.0.0.2"  # a loopback address other than the default 127.0.0.1: only the argument names it
    sender = WeightSender(1, host=host, timeout_s=30, connect_timeout_s=120, token=TOKEN)
    assert sender.address[0] == host
    procs += start_plain_receivers(sender.address, ["rx"], token=TOKEN)
    sender.connect()
    listening = {c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert host in listening  # the sender's gloo end listens on the host it advertises
    assert sender.push(iter(_weights()), version=1)["acks"] == {"rx": "1"}
