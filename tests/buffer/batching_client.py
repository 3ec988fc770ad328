"""`BufferClient` plus the calls only tests and benchmarks make: several groups per round trip, and ping.

Runs push one group at a time (`actors.link.Outbox`); the buffer's wire accepts several groups per push
message (one Ack each) and pipelined requests, which these calls exercise.
"""

from __future__ import annotations

from buffer.client import Ack, BufferClient, Credit
from buffer.records import Group


class BatchingClient(BufferClient):
    def push_groups(self, groups: list[Group]) -> list[Ack]:
        """Push several groups in one round trip (one Ack each, same order)."""
        return self._push(groups)[0]

    def push_and_request_credit(self, groups: list[Group], want: int, actor_version: int,
                                wait_s: float = 0.0) -> tuple[list[Ack], Credit]:
        """push_groups(groups), then request_credit(want, actor_version, wait_s) once they are admitted, in
        one round trip (requests are pipelined; the buffer handles one client's requests in order)."""
        credit = ("credit", self._credit_fields(want, actor_version, wait_s), ())
        return self._push(groups, credit, wait_s)

    def ping(self) -> int:
        """Round trip; returns the learner version."""
        rep = self._call("ping")
        self._check(rep)
        return rep.fields["version"]
