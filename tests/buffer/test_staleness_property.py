"""Property: whatever the interleaving of credit requests (alone or several waiting at once), pushes,
weight syncs, learner steps and raises of the bound (`max_staleness: auto`), no group is ever served
staler than the bound it was admitted under, credit accounting is
exact and capacity holds; and when groups arrive in the order their credit was granted, the credit rule
alone keeps everything fresh (no drops).

Driven against BufferCore in-process (hypothesis state machine) so thousands of interleavings run in
seconds; the service adds only transport around the same object (tested end to end elsewhere).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from buffer.core import BufferCore
from buffer.settings import BufferSettings
from tests.buffer.helpers import make_group, wire

ACTORS = ("a0", "a1", "a2")


class BufferModel(RuleBasedStateMachine):
    @initialize(k=st.integers(0, 3), b=st.integers(1, 4), cap=st.integers(1, 24), in_order=st.booleans(),
                flt=st.sampled_from(["none", "extreme"]))
    def setup(self, k, b, cap, in_order, flt):
        self.b, self.in_order = b, in_order
        self.core = BufferCore(BufferSettings(max_staleness=k, batch_prompts=b, capacity_groups=max(cap, b),
                                              filter=flt))
        self.weights = dict.fromkeys(ACTORS, 0)  # version each actor generates with
        self.inflight: list[tuple[str, int]] = []  # (actor, start version), in grant order
        self.served_lags: list[tuple[int, int]] = []  # (lag, bound at admission)
        self.bound: dict[str, int] = {}  # group id -> max_staleness in force when its push was accepted
        self.counter = 0
        self.training = False

    @rule(actor=st.sampled_from(ACTORS), want=st.integers(0, 6))
    def ask_credit(self, actor, want):
        g = self.core.request_credit(actor, want, self.weights[actor])
        assert 0 <= g <= want
        self.inflight += [(actor, self.weights[actor])] * g

    @rule(wants=st.lists(st.integers(0, 6), min_size=len(ACTORS), max_size=len(ACTORS)),
          order=st.permutations(ACTORS))
    def waiting_requests_share(self, wants, order):
        """Several requests waiting at once, shared fairly (`BufferCore.grant_waiting`): same bound."""
        grants = self.core.grant_waiting([(a, w, self.weights[a]) for a, w in zip(order, wants)])
        assert all(0 <= g <= w for g, w in zip(grants, wants))
        for a, g in zip(order, grants):
            self.inflight += [(a, self.weights[a])] * g

    @rule(actor=st.sampled_from(ACTORS))
    def sync_weights(self, actor):
        self.weights[actor] = self.core.version

    @precondition(lambda self: self.inflight)
    @rule(pick=st.integers(0, 1000), newer=st.integers(0, 2), rewards=st.sampled_from([[0, 1], [0, 0], [1, 1]]))
    def finish_group(self, pick, newer, rewards):
        i = 0 if self.in_order else pick % len(self.inflight)
        actor, start = self.inflight.pop(i)
        self.counter += 1
        g = make_group(f"g{self.counter}", n=2, tokens=3, version=start, rewards=rewards)
        for s in g.samples:  # weights may update mid-generation: later tokens carry newer versions
            s.versions[-1] = min(start + newer, self.core.version)
        acc, reason, _ = self.core.push(actor, wire(g))
        assert acc or reason in ("stale", "filtered_extreme"), reason
        self.bound[g.group_id] = self.core.max_staleness

    @precondition(lambda self: self.inflight)
    @rule(actor=st.sampled_from(ACTORS), n=st.integers(1, 3))
    def abandon_work(self, actor, n):
        mine = [j for j, (a, _) in enumerate(self.inflight) if a == actor][-n:]
        for j in reversed(mine):
            self.inflight.pop(j)
        self.core.release_credit(actor, len(mine))

    @precondition(lambda self: not self.in_order)
    @rule(behind=st.integers(-1, 4))
    def uncredited_push(self, behind):
        self.counter += 1  # a rogue actor ignoring credit, possibly far behind (or claiming a future version)
        g = make_group(f"r{self.counter}", n=2, tokens=3, version=max(0, self.core.version - behind))
        self.core.push("rogue", wire(g))
        self.bound[g.group_id] = self.core.max_staleness

    @precondition(lambda self: not self.training)
    @rule()
    def learner_pull(self):
        groups = self.core.take(self.b)
        if groups is None:
            return
        for g in groups:  # checked before the buffer's own record
            assert self.core.version - g.oldest_version <= self.bound[g.group_id] <= self.core.max_staleness
        self.served_lags += zip(self.core.served(groups), [self.bound[g.group_id] for g in groups])
        self.training = True  # actors keep asking for credit while the learner trains on this batch

    @precondition(lambda self: self.training)
    @rule(raise_by=st.sampled_from([0, 0, 0, 1, 2]))
    def learner_step_done(self, raise_by):
        """The driver's set_version, raising the bound now and then (never lowering it)."""
        self.core.set_version(self.core.version + 1, self.core.max_staleness + raise_by if raise_by else None)
        self.training = False

    @invariant()
    def never_above_the_bound(self):
        assert all(lag <= bound for lag, bound in self.served_lags)  # < 0 only for a rogue's future version
        assert all(self.core.version - g.oldest_version <= self.bound[g.group_id] for g in self.core.queue)

    @invariant()
    def accounting(self):
        c = self.core
        assert c.ledger.total == len(self.inflight) == sum(c.ledger.by_client().values())
        assert len(c.queue) + c.ledger.total <= c.s.capacity_groups
        s = c.stats()
        assert s["groups_in"] == s["groups_out"] + s["occupancy_groups"] + s["dropped"].get("stale_on_version", 0) \
            + s["dropped"].get("stale_on_serve", 0)

    @invariant()
    def in_order_arrival_never_drops(self):
        if self.in_order:
            assert self.core.stats()["dropped_stale"] == 0


BufferModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
TestBufferModel = BufferModel.TestCase
