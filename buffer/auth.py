"""Per-run credentials: who may talk to the run's services once they listen beyond loopback.

`RunSecrets.generate()` is called once by the driver. The buffer serves over ZMQ CURVE with the
server key pair and accepts only clients that present the run's client key pair (ZAP, checked
against `client_public`); the weight-sync rendezvous admits a peer only after it proves it knows
`weight_sync_token`. The secrets travel to the processes that need them as call arguments
(through Ray or a multiprocessing pipe) — never through the run folder or the command line.

`public()` is what an actor or the driver needs (no server secret); `for_server()` what the buffer
process needs. Keys are Z85 text (40 characters), as `zmq.curve_keypair()` returns them.

What a refused peer sees: ZMQ CURVE drops a failed handshake and the peer's messages are never
delivered, so a stranger's requests simply go unanswered. `handshake_problem` turns the handshake
events of our own client's socket into the reason it names when such a request times out.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, replace

import zmq
from zmq.utils import z85

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks for authentication decisions (ZMQ RFC 27)
ZAP_DOMAIN = b"buffer"
HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


@dataclass(frozen=True)
class RunSecrets:
    server_public: bytes
    server_secret: bytes | None  # only the buffer process holds it
    client_public: bytes
    client_secret: bytes | None  # only clients (actors, driver) hold it; None in for_server()
    weight_sync_token: str | None  # hex, 32 bytes of entropy; None in for_server()

    @classmethod
    def generate(cls) -> RunSecrets:
        if not zmq.has("curve"):
            raise RuntimeError("this pyzmq/libzmq build has no CURVE support; install the pyzmq wheels from PyPI")
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret, secrets.token_hex(32))

    def public(self) -> RunSecrets:
        """The credentials of a client (actor, driver): everything but the server's secret key."""
        return replace(self, server_secret=None)

    def for_server(self) -> RunSecrets:
        """The credentials of the buffer process: its key pair and the client public key it admits —
        not the client's secret key nor the weight-sync token."""
        return replace(self, client_secret=None, weight_sync_token=None)

    def __repr__(self) -> str:  # never print a secret into a log
        return f"RunSecrets(server_public={self.server_public.decode()!r}, secrets hidden)"


def zap_answer(request: list[bytes], client_public: bytes) -> tuple[list[bytes], bool]:
    """The ZAP reply to one request, and whether it admits the peer.

    request: the frames a ZAP handler receives on a REP socket, [version, request_id, domain, address,
    identity, mechanism, *credentials] (RFC 27). Admitted: mechanism CURVE whose one credential (the
    peer's 32-byte public key) equals `client_public` (Z85). Everything else gets status 400.
    """
    request_id = request[1] if len(request) > 1 else b""
    ok = (len(request) == 7 and request[0] == b"1.0" and request[5] == b"CURVE"
          and hmac.compare_digest(request[6], z85.decode(client_public)))
    status = [b"200", b"OK"] if ok else [b"400", b"not this run's client key"]
    return [b"1.0", request_id, *status, b"run-client" if ok else b"", b""], ok


def handshake_problem(event: int, value: int, has_keys: bool) -> str | None:
    """Why a client's handshake failed, from one socket-monitor event (None: not a failure)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"authentication failed: the buffer refused this client's CURVE key (ZAP status {value}); "
                f"it is not this run's client key")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return ("authentication failed: security mechanism mismatch — " +
                ("this client uses CURVE keys but the buffer serves without authentication" if has_keys else
                 "the buffer requires CURVE authentication and this client has no keys "
                 "(pass secrets=RunSecrets.public() of this run)"))
    if has_keys and event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
        return (f"authentication failed: the buffer dropped this client's CURVE handshake (monitor event "
                f"{event}, value {value:#x}); wrong server public key?")
    return None  # not a failure, or one a client without keys cannot attribute to authentication
