"""Who may talk to the buffer: bind vs advertised address, CURVE keys, refused strangers, counters.

Real spawned buffer processes and real sockets on this machine only (loopback; one test binds 0.0.0.0
and connects through 127.0.0.2, which Linux routes to loopback too).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import zmq

from actors.link import BufferDown, BufferLink
from buffer.auth import RunSecrets, zap_answer
from buffer.client import BufferAuthError, BufferClient, BufferUnavailable
from buffer.settings import BufferSettings, listen_hosts
from tests.buffer.batching_client import BatchingClient
from tests.buffer.helpers import call_blocking, make_group

STRANGER_TIMEOUT_S = 2.0  # room for the refused handshake to be reported on a loaded machine


@pytest.mark.parametrize("host, advertise, expected", [
    ("auto", None, ("127.0.0.1", "127.0.0.1")),  # one machine: loopback only
    ("auto", "10.1.2.3", ("0.0.0.0", "10.1.2.3")),  # cluster: every interface, the node IP told to clients
    ("0.0.0.0", None, ("0.0.0.0", "127.0.0.1")),
    ("0.0.0.0", "10.1.2.3", ("0.0.0.0", "10.1.2.3")),
    ("10.9.9.9", None, ("10.9.9.9", "10.9.9.9")),  # the user's interface is also what clients use
    ("10.9.9.9", "10.1.2.3", ("10.9.9.9", "10.9.9.9")),
    ("127.0.0.5", None, ("127.0.0.5", "127.0.0.5")),
])
def test_listen_hosts(host, advertise, expected):
    assert listen_hosts(host, advertise) == expected


@pytest.mark.parametrize("host, advertise, message", [
    ("127.0.0.1", "10.1.2.3", "buffer.host: 127.0.0.1 listens on loopback only"),
    ("eth0", None, "neither 'auto' nor an IPv4 address"),
    ("auto", "", "advertise host ''"),
    ("auto", "fe80::1", "IPv6 is not supported"),
])
def test_listen_hosts_refuses(host, advertise, message):
    with pytest.raises(ValueError, match=message):
        listen_hosts(host, advertise)
    with pytest.raises(ValueError, match=message):  # the settings check it when built (in the launcher)
        BufferSettings(host=host, advertise_host=advertise)


def test_settings_addresses():
    s = BufferSettings(host="auto", advertise_host="10.1.2.3", port=0)
    assert (s.bind_address, s.client_address(5555)) == ("tcp://0.0.0.0:*", "tcp://10.1.2.3:5555")
    assert BufferSettings(port=7).bind_address == "tcp://127.0.0.1:7"


def test_zap_answer_admits_only_the_run_client_key():
    s, other = RunSecrets.generate(), RunSecrets.generate()
    key = zmq.utils.z85.decode(s.client_public)

    def request(mechanism, *credentials):
        return [b"1.0", b"7", b"buffer", b"10.0.0.5", b"", mechanism, *credentials]

    assert zap_answer(request(b"CURVE", key), s.client_public) == ([b"1.0", b"7", b"200", b"OK", b"run-client", b""],
                                                                   True)
    for bad in (request(b"CURVE", zmq.utils.z85.decode(other.client_public)), request(b"NULL"),
                request(b"PLAIN", b"user", b"pass"), request(b"CURVE", key)[:5]):
        reply, ok = zap_answer(bad, s.client_public)
        assert not ok and reply[2] == b"400" and reply[1] == bad[1]


def test_secrets_split_and_repr():
    s = RunSecrets.generate()
    assert s.public().server_secret is None and s.public().client_secret == s.client_secret
    server = s.for_server()
    assert (server.client_secret, server.weight_sync_token, server.server_secret) == (None, None, s.server_secret)
    assert s.server_secret.decode() not in repr(s) and s.client_secret.decode() not in repr(s)


def test_plain_buffer_stays_on_loopback(start_buffer):
    addr = start_buffer()
    assert addr.startswith("tcp://127.0.0.1:")
    with BufferClient(addr, "learner", timeout_s=10) as c:
        s = c.stats()
    assert (s["address"], s["bind_address"], s["auth"]) == (addr, addr, {"curve": False, "refused": 0, "refused_peers": 0})


def test_start_refuses_client_secrets_and_loopback_on_a_cluster():
    from buffer.process import start_buffer_process

    s = RunSecrets.generate()
    with pytest.raises(ValueError, match="full RunSecrets"):
        start_buffer_process(None, secrets=s.public())
    with pytest.raises(ValueError, match="buffer.host: 127.0.0.1 listens on loopback only"):
        start_buffer_process({"host": "127.0.0.1"}, advertise_host="10.1.2.3")
    with pytest.raises(ValueError, match="run's client key pair"):
        BufferClient("tcp://127.0.0.1:1", "actor", secrets=s.for_server())


@pytest.fixture
def curve_buffer(start_buffer):
    """A buffer with the run's secrets, bound to every interface and advertised as 127.0.0.2."""
    secrets = RunSecrets.generate()
    return start_buffer(secrets=secrets, advertise_host="127.0.0.2"), secrets


def test_only_the_run_key_is_served_and_strangers_are_counted(curve_buffer):
    addr, secrets = curve_buffer
    assert addr.startswith("tcp://127.0.0.2:")  # the advertised address, not the bound 0.0.0.0
    port = addr.rsplit(":", 1)[1]
    keys = secrets.public()
    other_run = RunSecrets.generate().public()  # another run's keys: the server key does not match
    wrong_client = replace(keys, client_public=other_run.client_public,  # right server key, unknown client key
                           client_secret=other_run.client_secret)
    strangers = {None: "this client has no keys", other_run: "wrong server public key",
                 wrong_client: "not this run's client key"}
    with BatchingClient(addr, "actor-0", timeout_s=10, secrets=keys) as actor, \
            BufferClient(addr, "learner", timeout_s=10, secrets=keys) as learner:
        assert actor.request_credit(4, 0).granted == 4
        assert all(a.accepted for a in actor.push_groups([make_group("a"), make_group("b")]))
        assert [g.group_id for g in learner.pull_batch(2, timeout_s=5)] == ["a", "b"]
        assert all(a.accepted for a in actor.push_groups([make_group("c"), make_group("d")]))
        # The server's counters below prove the refusals. The client names the reason when libzmq reported
        # the refused handshake before the call timed out (usually, not always on a loaded machine):
        # otherwise the call fails as plain BufferUnavailable (BufferAuthError is a subclass).
        reasons = []
        for keys_of_stranger, reason in strangers.items():
            # the same client id as the real actor: an identity is no credential
            with BufferClient(addr, "actor-0", timeout_s=STRANGER_TIMEOUT_S, secrets=keys_of_stranger) as stranger:
                for call in (lambda: stranger.push_group(make_group("evil")),
                             lambda: stranger.pull_batch(2, timeout_s=0.1), stranger.stats):
                    with pytest.raises(BufferUnavailable) as err:
                        call()
                    if isinstance(err.value, BufferAuthError):
                        assert "authentication failed" in str(err.value) and reason in str(err.value)
                        reasons.append(reason)
        assert reasons, "no stranger call was told why it was refused"
        # nothing was taken by the strangers: the two stored groups are still there for the learner
        assert [g.group_id for g in learner.pull_batch(2, timeout_s=5)] == ["c", "d"]
        s = learner.stats()
    assert (s["groups_in"], s["groups_out"], s["duplicates"], s["rejected_total"]) == (4, 4, 0, 0)
    assert s["credits_by_client"] == {}  # the real actor spent its 4 credits; nobody else got any
    assert (s["address"], s["bind_address"]) == (addr, f"tcp://0.0.0.0:{port}")
    auth = s["auth"]
    assert auth["curve"] and auth["accepted"] >= 2  # actor and learner (plus reconnects, if any)
    # each stranger socket tried at least once per call: 3 calls × (no keys: protocol; wrong server key:
    # protocol or no detail; wrong client key: ZAP refused)
    assert auth["refused_key"] >= 3 and auth["refused_protocol"] + auth["refused_other"] >= 6
    assert auth["refused"] == auth["refused_key"] + auth["refused_protocol"] + auth["refused_other"]
    # peers, not attempts: the wrong client key from 127.0.0.1, plus one for the keyless handshakes
    assert auth["refused_peers"] == 2 < auth["refused"]


def test_actor_link_uses_the_run_keys(curve_buffer):
    addr, secrets = curve_buffer
    link = BufferLink(addr, "actor-3", timeout_s=5, secrets=secrets.public(), client_factory=BatchingClient)
    stranger = BufferLink(addr, "actor-4", timeout_s=STRANGER_TIMEOUT_S)
    try:
        assert call_blocking(link, "ping") == 0
        assert call_blocking(link, "request_credit", 1, 0).granted == 1
        assert call_blocking(link, "push_group", make_group("x")).accepted
        with pytest.raises(BufferDown):  # "authentication failed" when the refusal was reported in time
            call_blocking(stranger, "push_group", make_group("y"))
        s = call_blocking(link, "stats")
        assert s["groups_in"] == 1 and s["auth"]["refused"] >= 1
    finally:
        link.close()
        stranger.close()
