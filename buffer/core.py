"""The buffer's logic without sockets: store, admit, filter, attach demonstrations, serve, count.

`BufferCore` is what the service process runs and what tests drive in-process. It holds validated
`WireGroup`s in a FIFO, grants credit with `admission.credit_grant` (shared among waiting requests by
`admission.fair_shares`), drops stale groups with `admission.is_stale` (on arrival, when the version
advances, and at serve time), applies the group filter after demonstrations are attached (so a LUFFY
group whose on-policy rows all failed but whose teacher row succeeded is kept), and counts every drop,
filter and rejection by reason.

The bound K may be raised mid-run (`set_version(v, max_staleness)`, for `max_staleness: auto`), never
lowered: credit in flight was granted under the bound in force. A group is admitted when its push is
accepted, and it keeps the bound in force then (`WireGroup.bound`): the later checks hold it to that
bound, so raising K never loosens the bound of a group already stored and every group served satisfies
the bound it was admitted under.

A group the buffer discards (filtered, or dropped as stale) settles its prompt for that epoch just as
training it would: its (epoch, prompt) key is kept in `discarded` and handed to the learner with the
next pull (`served_discarded`), so the driver's ledger -- the one owner of prompt progress -- knows it
and no restarted actor or resumed run generates it again. Keys not yet handed over when the process
dies are lost with it: those prompts are generated once more (work, not a correctness issue).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque

import numpy as np

from buffer import checks as C
from buffer.admission import CreditLedger, credit_grant, fair_shares, is_stale, staleness
from buffer.checks import WireError
from buffer.settings import BufferSettings
from buffer.wire_group import WireGroup, attach_demo

EPS = 1e-9


class BufferCore:
    def __init__(self, settings: BufferSettings, clock=time.monotonic):
        self.s = settings
        self.limits = settings.limits
        self.clock = clock
        self.version = 0
        self.max_staleness = settings.max_staleness  # K for new credit and arrivals; only ever raised
        self.served_at_version = 0  # groups handed to the learner since the version last advanced
        self.queue: deque[WireGroup] = deque()
        self.ledger = CreditLedger()
        self.demos: dict[int, tuple[np.ndarray, float]] = {}
        self.demo_tokens = 0
        self.seen: OrderedDict[str, bool] = OrderedDict()  # group_id -> accepted (dedup window)
        self.counts: Counter = Counter()  # flat keys; "rejected/<reason>" etc. are nested in stats()
        self.lag_hist: Counter = Counter()
        self.discarded: list[list[int]] = []  # [epoch, prompt] of discarded groups, until the next pull

    # ---- admission -------------------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        """Groups ahead of new work: stored + credited in flight."""
        return len(self.queue) + self.ledger.total

    def touch(self, client: str) -> None:
        self.ledger.touch(client, self.clock())

    def request_credit(self, client: str, want: int, actor_version: int) -> int:
        """Grant what the rule allows to one request now (`grant_waiting` with nobody else waiting)."""
        self.touch(client)
        g = self.grant_waiting([(client, want, actor_version)])[0]
        self.counts["credit_units_denied"] += want - g
        return g

    def _grant(self, want: int, actor_version: int) -> int:
        return credit_grant(want, actor_version, self.version, self.queued, self.served_at_version,
                            self.s.batch_prompts, self.max_staleness, self.s.capacity_groups)

    def grant_waiting(self, requests: list[tuple[str, int, int]]) -> list[int]:
        """Credit for waiting requests (client, want, actor_version), oldest first: the free units are
        shared by `fair_shares` among the requests and granted oldest first through `credit_grant` (the
        staleness bound; `buffer.admission`). What a request with older weights may not take stays free."""
        free = self._grant(self.s.capacity_groups, self.version)  # what an actor at the learner's version may get
        if free == 0:
            return [0] * len(requests)
        shares = fair_shares(free, [want for _, want, _ in requests])
        grants = []
        for (client, _, a), share in zip(requests, shares):
            g = self._grant(share, a) if share else 0
            if g:
                self.ledger.grant(client, g)
            grants.append(g)
        return grants

    def release_credit(self, client: str, n: int) -> int:
        return self.ledger.release(client, n)

    def expire_credits(self) -> int:
        return self.ledger.expire(self.clock(), self.s.credit_ttl_s)

    def reject(self, reason: str, client: str | None = None, msg_type: str | None = None) -> None:
        """Count a rejected message; a rejected push gives its credit back (the actor will not resend it)."""
        self.counts[f"rejected/{reason}"] += 1
        if msg_type == "push" and client is not None:
            self.ledger.release(client, 1)

    # ---- groups in -------------------------------------------------------------------------------------
    def _remember(self, gid: str, accepted: bool) -> None:
        self.seen[gid] = accepted
        while len(self.seen) > self.s.dedup_window:
            self.seen.popitem(last=False)

    def push(self, client: str, wg: WireGroup) -> tuple[bool, str, str]:
        """Admit one validated group -> (accepted, reason, message)."""
        gid = wg.group_id
        if gid in self.seen:
            self.counts["duplicates"] += 1
            return self.seen[gid], "duplicate", f"group {gid!r} was already received; not stored again"
        if not self.ledger.consume(client):
            self.counts["pushes_without_credit"] += 1
            if self.queued >= self.s.capacity_groups:
                self.counts["rejected/buffer_full"] += 1
                return False, "buffer_full", (f"no credit and the buffer is full ({self.s.capacity_groups} "
                                              f"groups): ask for credit before starting prompts")
        k = wg.demo_rows - wg.demos_attached
        if k > 0:
            demo = self.demos.get(wg.prompt_index)
            if demo is None:
                self.counts["rejected/missing_demo"] += 1
                return False, "missing_demo", (f"group {gid!r} expects {k} demonstration rows but the buffer "
                                               f"holds no demonstration for prompt {wg.prompt_index}")
            if wg.n + k > self.limits.max_samples:
                self.counts[f"rejected/{C.TOO_MANY_SAMPLES}"] += 1
                return False, C.TOO_MANY_SAMPLES, f"group {gid!r}: {wg.n} + {k} demo rows exceed the limit"
            wg = attach_demo(wg, demo[0], demo[1], k)
            self.counts["demo_rows_used"] += k
            self.counts["demo_groups"] += 1
        self._count_generated(wg)
        if is_stale(self.version, wg.oldest_version, self.max_staleness):
            self._drop(wg, "stale_on_arrival")
            self._remember(gid, False)
            return False, "stale", (f"group {gid!r}: oldest version {wg.oldest_version} is more than "
                                    f"{self.max_staleness} behind the learner's {self.version}")
        why = self._filtered(wg)
        if why:
            self.counts[f"filtered/{why}"] += 1
            self.discarded.append(list(wg.key))
            self._remember(gid, False)
            return False, f"filtered_{why}", f"group {gid!r}: mean reward {wg.rewards().mean():.3f} ({why} filter)"
        wg.bound = self.max_staleness
        self.queue.append(wg)
        self._remember(gid, True)
        self.counts["groups_in"] += 1
        self.counts["samples_in"] += wg.n
        return True, "ok", ""

    def _count_generated(self, wg: WireGroup) -> None:
        """Every generated row that arrives (demonstration rows excluded), before the staleness check and the
        group filter: `generated_samples` and, of them, `generated_correct` (reward ≥ 1). PRIME's paper reports
        training accuracy on these, all rollouts before its filter, against samples generated."""
        rewards = [r for r, why in zip(wg.rewards(), wg.header["finish_reasons"]) if why != "demo"]
        self.counts["generated_samples"] += len(rewards)
        self.counts["generated_correct"] += int(sum(r >= 1.0 for r in rewards))

    def _filtered(self, wg: WireGroup) -> str:
        r = wg.rewards()
        if self.s.filter == "extreme" and ((r == 0).all() or (r == 1).all()):
            return "extreme"
        if self.s.filter == "accuracy_window":
            m = float(r.mean())
            if not (self.s.acc_lo - EPS <= m <= self.s.acc_hi + EPS):
                return "accuracy_window"
        return ""

    def _drop(self, wg: WireGroup, why: str) -> None:
        self.counts["dropped_stale"] += 1
        self.counts[f"dropped/{why}"] += 1
        self.counts["dropped_samples"] += wg.n
        self.discarded.append(list(wg.key))

    def _purge(self, why: str) -> None:
        if any(is_stale(self.version, g.oldest_version, g.bound) for g in self.queue):
            keep = deque()
            for g in self.queue:
                if is_stale(self.version, g.oldest_version, g.bound):
                    self._drop(g, why)
                else:
                    keep.append(g)
            self.queue = keep

    # ---- learner side ----------------------------------------------------------------------------------
    def set_version(self, version: int, max_staleness: int | None = None) -> None:
        """The learner's new version and, optionally, a raised staleness bound for new credit and arrivals
        (`max_staleness: auto`). Never lowered: credit in flight was granted under the bound in force."""
        if version < self.version:
            raise WireError(C.BAD_VALUE, f"set_version: {version} is below the current version {self.version}; "
                                         f"versions never go back (restore a snapshot to rewind)")
        if max_staleness is not None and max_staleness < self.max_staleness:
            raise WireError(C.BAD_VALUE, f"set_version: max_staleness {max_staleness} is below the bound in force, "
                                         f"{self.max_staleness}; it is never lowered (credit in flight was granted "
                                         f"under it)")
        if max_staleness is not None:
            self.max_staleness = max_staleness
        if version > self.version:
            self.served_at_version = 0
        self.version = version
        self._purge("stale_on_version")

    def take(self, num: int) -> list[WireGroup] | None:
        """Pop `num` groups FIFO if that many fresh ones are stored, else None (nothing removed)."""
        if num > self.s.capacity_groups:
            raise WireError(C.BAD_VALUE, f"pull: {num} groups can never be served by a buffer of "
                                         f"capacity_groups={self.s.capacity_groups}")
        out: list[WireGroup] = []
        while len(out) < num and len(self.queue) >= num - len(out):
            g = self.queue.popleft()
            if is_stale(self.version, g.oldest_version, g.bound):  # defensive: purged already
                self._drop(g, "stale_on_serve")
            else:
                out.append(g)
        if len(out) < num:
            self.queue.extendleft(reversed(out))
            return None
        return out

    def served(self, groups: list[WireGroup]) -> list[int]:
        """Record groups handed to the learner; returns their lags."""
        lags = [staleness(self.version, g.oldest_version) for g in groups]
        for g, lag in zip(groups, lags):
            assert lag <= g.bound, "a stale group reached the learner"
            self.lag_hist[lag] += 1
            self.served_at_version += 1
            self.counts["groups_out"] += 1
            self.counts["samples_out"] += g.n
        return lags

    def served_discarded(self) -> list[list[int]]:
        """The discarded keys for the reply of a pull (`requeue_front` puts them back if it fails)."""
        keys, self.discarded = self.discarded, []
        return keys

    def requeue_front(self, groups: list[WireGroup], discarded: list[list[int]] = ()) -> None:
        """Put back groups (and discarded keys) whose reply could not be delivered (order kept)."""
        self.queue.extendleft(reversed(groups))
        self.discarded[:0] = discarded
        self.counts["undelivered_batches"] += 1

    # ---- demonstrations --------------------------------------------------------------------------------
    def add_demos(self, items: list[tuple[int, np.ndarray, float]]) -> int:
        new_total = self.demo_tokens + sum(int(a.shape[0]) for _, a, _ in items) - sum(
            int(self.demos[i][0].shape[0]) for i, _, _ in items if i in self.demos)
        if new_total > self.s.max_demo_tokens:
            raise WireError(C.TOO_LARGE, f"add_demos: would hold {new_total} demonstration tokens, limit "
                                         f"{self.s.max_demo_tokens}")
        for i, a, r in items:
            self.demos[i] = (np.array(a, dtype="<i4"), float(r))  # own copy: the frame is not kept
        self.demo_tokens = new_total
        return len(items)

    # ---- stats -----------------------------------------------------------------------------------------
    def stats(self) -> dict:
        c = self.counts

        def nested(prefix: str) -> dict:
            return {k.split("/", 1)[1]: v for k, v in c.items() if k.startswith(prefix + "/")}

        served = sum(self.lag_hist.values())
        return {
            "version": self.version, "served_at_version": self.served_at_version, "max_staleness": self.max_staleness, "batch_prompts": self.s.batch_prompts,
            "capacity_groups": self.s.capacity_groups, "occupancy_groups": len(self.queue),
            "occupancy_samples": sum(g.n for g in self.queue),
            **{k: c[k] for k in ("groups_in", "groups_out", "samples_in", "samples_out", "generated_samples",
                                 "generated_correct", "dropped_stale",
                                 "dropped_samples", "duplicates", "pushes_without_credit", "demo_rows_used",
                                 "demo_groups", "undelivered_batches", "credit_units_denied")},
            "dropped": nested("dropped"), "filtered": nested("filtered"), "rejected": nested("rejected"),
            "rejected_total": sum(nested("rejected").values()),
            "demos_stored": len(self.demos), "demo_tokens_stored": self.demo_tokens,
            "credits_outstanding": self.ledger.total, "credits_by_client": self.ledger.by_client(),
            "credits_granted": self.ledger.granted, "credits_consumed": self.ledger.consumed,
            "credits_released": self.ledger.released, "credits_expired": self.ledger.expired,
            "lag_hist": {str(k): v for k, v in sorted(self.lag_hist.items())},
            "lag_mean": sum(k * v for k, v in self.lag_hist.items()) / served if served else 0.0,
            "lag_max": max(self.lag_hist) if self.lag_hist else 0,
            # (epoch, prompt_index) of every stored group: the launcher's prompt ledger counts these as
            # accepted, so restarted or resumed actors do not generate them again
            "held_prompts": [list(g.key) for g in self.queue],
            # (epoch, prompt_index) discarded since the last pull (the next pull hands them over): a checkpoint
            # written now records them as settled (`launch.state.run_checkpoints`)
            "discarded_pending": [list(k) for k in self.discarded],
        }
