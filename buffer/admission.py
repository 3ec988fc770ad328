"""The staleness rule, in one place: credit-based admission (how many units, and who gets them) plus the
serve-time check.

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

Who gets the units (fairness). `credit_grant` decides how many units may be outstanding; it does not
decide who holds them. Granting each request up to its want in arrival order (first come, first served)
starves actors: 32 actors asking for 8 prompts each with (K+1)·B = 128 free units give 16 actors 8 units
and 16 actors none, and whoever asks right after the learner advances takes the fresh batch. So actors
wait in the buffer (a long poll, parked in arrival order), and whenever units are free the waiting
requests share them by max-min fairness (`fair_shares`). With F free units (what an actor at the
learner's version could be granted: `credit_grant` with an unbounded want) and requests w_1..w_n in
arrival order, request i gets

    s_i = min(w_i, L) + [w_i > L and i is among the first F - sum_j min(w_j, L) requests with w_j > L]

where the level L is the largest integer with sum_j min(w_j, L) <= F; s_i = w_i for all i when
sum_j w_j <= F. So nobody gets more than it asked for, nothing is left over while someone wants more,
every request left short holds L or L + 1 units, and the odd units go to those waiting longest. In the
example L = 4: all 32 actors get 4. With fewer free units than waiting requests (L = 0) the F oldest get
one each and the others keep their place, first in line at the next opening. The shares are granted
oldest first through `credit_grant`, so a share is only a cap on top of the staleness rule: the bound
above holds exactly as without fairness. The split treats every waiting request as if its actor held the
learner's weights; one stated with older weights takes only what `credit_grant` allows it and the rest
stays free until the next pass. Right after the learner advances, actors restate their waiting requests
as they load the new weights (`buffer.client.BufferClient.interrupt`); giving the slower loaders' shares
to the faster ones would hand the same actors the fresh batch step after step.

A client id `name#channel` spends the credit account of `name` (`credit_account`): an actor long-polls
for credit on its own connection (`actor-3#credit`) so that its pushes (`actor-3`) never queue behind a
parked request, and the groups it pushes spend the units that connection was granted.
"""

from __future__ import annotations

from dataclasses import dataclass


def credit_grant(want: int, actor_version: int, learner_version: int, queued: int, served_at_version: int,
                 batch_prompts: int, max_staleness: int, capacity: int) -> int:
    """Units of credit to grant now (see the module docstring). `queued` = stored + in flight."""
    a = min(actor_version, learner_version)
    fresh_slots = (max_staleness + a - learner_version + 1) * batch_prompts
    return max(0, min(want, fresh_slots - queued - served_at_version, capacity - queued))


def behind(actor_version: int, learner_version: int, max_staleness: int) -> bool:
    """No credit can come before the actor loads newer weights: (K + a' - v + 1) * B <= 0 above."""
    return min(actor_version, learner_version) + max_staleness < learner_version


def fair_shares(free: int, wants: list[int]) -> list[int]:
    """Max-min fair split of `free` units among requests in arrival order (module docstring): each gets
    min(want, L) for the largest level L that fits, and the units left go one each to the oldest requests
    still short."""
    free = max(0, free)
    if sum(wants) <= free:
        return list(wants)
    lo, hi = 0, max(wants)  # sum(min(w, lo)) <= free < sum(min(w, hi))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if sum(min(w, mid) for w in wants) <= free else (lo, mid)
    shares = [min(w, lo) for w in wants]
    left = free - sum(shares)  # < the number of requests wanting more than lo, by the choice of lo
    for i, w in enumerate(wants):
        if left and w > lo:
            shares[i] += 1
            left -= 1
    return shares


CHANNEL = "#"


def credit_account(client_id: str) -> str:
    """The credit account of a client id: `name#channel` shares the account of `name`."""
    return client_id.split(CHANNEL, 1)[0]


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
        self.total = 0  # outstanding, all clients (kept up to date: the grant pass reads it per request)

    def touch(self, client: str, now: float) -> None:
        self._acc.setdefault(client, _Account()).last_seen = now

    def grant(self, client: str, n: int) -> None:
        self._acc.setdefault(client, _Account()).outstanding += n
        self.granted += n
        self.total += n

    def consume(self, client: str) -> bool:
        """One pushed group uses one unit; False when the client held none (an uncredited push)."""
        acc = self._acc.get(client)
        if acc is None or acc.outstanding == 0:
            return False
        acc.outstanding -= 1
        self.consumed += 1
        self.total -= 1
        return True

    def release(self, client: str, n: int) -> int:
        acc = self._acc.get(client)
        k = min(n, acc.outstanding) if acc else 0
        if k:
            acc.outstanding -= k
            self.released += k
            self.total -= k
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
        self.total -= n
        return n

    def clear(self) -> None:
        for acc in self._acc.values():
            acc.outstanding = 0
        self.total = 0

    def by_client(self) -> dict[str, int]:
        return {c: a.outstanding for c, a in self._acc.items() if a.outstanding}
