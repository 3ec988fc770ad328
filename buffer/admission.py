"""The staleness rule, in one place: credit-based admission plus the serve-time check.

Why credits: stale work should not be started rather than generated and thrown away. An actor asks for
credit (one unit = one prompt/group) before it starts prompts, stating the weight version `a` it
generates with; the buffer grants only units whose groups will still be fresh when the learner trains
on them.

The rule. Let v be the learner's version, B = batch_prompts (groups the learner consumes per version),
K = max_staleness, and Q = groups ahead of a new unit of work: stored + credits outstanding (in flight)
+ groups already served at version v (the learner trains on those at v, so the next batch goes out at
v + 1). The learner serves FIFO and takes B groups per version, so the unit at queue slot Q (0-based)
is expected to be trained at version v + floor(Q / B). Unit i of a request (i = 0, 1, ...) sits at slot
Q + i and is granted iff

    v + floor((Q + i) / B) - a <= K      <=>      Q + i < (K + a - v + 1) * B

so   granted = clamp((K + a' - v + 1) * B - Q,  0,  min(want, capacity_groups - stored - in flight))

with a' = min(a, v) (an actor cannot be ahead of the learner). With K = 0 an actor at the learner's
version gets at most one batch's worth (B - Q) and an actor behind it gets nothing until it loads the new
weights: the system runs synchronously.

The estimate is exact when groups arrive in the order their credit was granted; when a later-granted
group overtakes, an earlier one can be pushed back a version. So the bound is also enforced at the data:
a group whose staleness (learner version - group.oldest_version()) exceeds K is dropped and counted on
arrival, whenever the version advances, and (defensively) at serve time. `is_stale` is that check.
"""

from __future__ import annotations

from dataclasses import dataclass


def credit_grant(want: int, actor_version: int, learner_version: int, queued: int, served_at_version: int,
                 batch_prompts: int, max_staleness: int, capacity: int) -> int:
    """Units of credit to grant now (see the module docstring). `queued` = stored + in flight."""
    a = min(actor_version, learner_version)
    fresh_slots = (max_staleness + a - learner_version + 1) * batch_prompts
    return max(0, min(want, fresh_slots - queued - served_at_version, capacity - queued))


def staleness(learner_version: int, oldest_version: int | None) -> int:
    """Versions between the learner and the oldest generated token (0 for demonstration-only groups)."""
    return 0 if oldest_version is None else learner_version - oldest_version


def is_stale(learner_version: int, oldest_version: int | None, max_staleness: int) -> bool:
    return staleness(learner_version, oldest_version) > max_staleness


@dataclass
class _Account:
    outstanding: int = 0
    last_seen: float = 0.0


class CreditLedger:
    """Credits outstanding per client id (survives reconnects, which keep the id)."""

    def __init__(self) -> None:
        self._acc: dict[str, _Account] = {}
        self.granted = self.released = self.consumed = self.expired = 0

    def touch(self, client: str, now: float) -> None:
        self._acc.setdefault(client, _Account()).last_seen = now

    def grant(self, client: str, n: int) -> None:
        self._acc.setdefault(client, _Account()).outstanding += n
        self.granted += n

    def consume(self, client: str) -> bool:
        """One pushed group uses one unit; False when the client held none (an uncredited push)."""
        acc = self._acc.get(client)
        if acc is None or acc.outstanding == 0:
            return False
        acc.outstanding -= 1
        self.consumed += 1
        return True

    def release(self, client: str, n: int) -> int:
        acc = self._acc.get(client)
        k = min(n, acc.outstanding) if acc else 0
        if k:
            acc.outstanding -= k
            self.released += k
        return k

    def expire(self, now: float, ttl_s: float) -> int:
        """Reclaim the credits of clients silent for more than ttl_s (e.g. a dead actor)."""
        if ttl_s <= 0:
            return 0
        n = 0
        for client, acc in list(self._acc.items()):
            if now - acc.last_seen > ttl_s:
                n += acc.outstanding
                del self._acc[client]  # also forgets idle clients, so the table stays small
        self.expired += n
        return n

    def clear(self) -> None:
        for acc in self._acc.values():
            acc.outstanding = 0

    @property
    def total(self) -> int:
        return sum(a.outstanding for a in self._acc.values())

    def by_client(self) -> dict[str, int]:
        return {c: a.outstanding for c, a in self._acc.items() if a.outstanding}
