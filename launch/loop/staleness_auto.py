"""`buffer.max_staleness: auto`: the smallest staleness bound K at which the learner stops waiting for data,
chosen from the run's own step times and re-checked as they change.

The rule. Let B = learner.batch_prompts, G = the time the actors take to generate one batch once its
credit is granted (latency: the engines batch every prompt in flight), and L = the learner's busy time
per step (`time/train_s` + `time/weight_sync_s` + the loop's bookkeeping: the step interval minus the
wait). At learner version v the buffer grants credit up to (K + 1)·B groups ahead (`buffer.admission`);
the driver's `set_version(v)` frees the slots of the batch just served, so the batch whose credit opens
then is trained at version v + K: the learner first trains K batches, v .. v + K − 1, and pulls it one
period P = w + L per version later, where w is its wait per step. So in steady state

    w = max(0, G − K·P)   =>   G = (K + 1)·w + K·L   when w > 0

(K = 0: w = G, the synchronous run). The learner does not wait (w = 0, P = L) iff G ≤ K'·L, so the
smallest such bound is

    K' = ceil(G / L) = K + ceil((K + 1)·w / L)        (for w > 0; K' = K when w = 0)

clamped to the ceiling `buffer.max_staleness_cap`. From one window of measured means (w, L) at K this is
exact under the model; a larger K also puts more prompts in flight per engine, which changes G (often
for the better: engines batch more), so the rule runs again every window and raises K again if the
learner still waits.

When raising does not help: if the actors cannot produce one batch per L at any concurrency (their
throughput, not the latency, is the limit), w stays > 0 whatever K is. And where the actors and the
learner share cores (one CPU machine), more prompts in flight take CPU from the learner: w falls but L
grows by as much or more (the learner-heavy profile, 2 cores: K 1 -> 2 took w 0.46 -> 0.18 s but L
2.79 -> 3.52 s; fixed K = 1, 2, 4 made 28.0, 24.1, 22.6 samples/s; bench/RESULTS.md). So a raise must
pay in what the run is after, the step interval P = w + L: when the first window after a raise shows a
P not below (1 − TOLERANCE) × the P measured before it, K stays, and stays through later windows (whose
waits at the same K say nothing about K) until one shows no wait: more staleness would only cost
off-policyness. A learner that waits again after that (longer responses) gets a raise again.

The learner "does not wait" when w ≤ TOLERANCE × L (a few milliseconds of bookkeeping always remain).
K is never lowered: credit in flight was granted under the bound in force, and the buffer holds each
stored group to the bound it was admitted under (`buffer.core`), so the bound the buffer reports
(`buffer/max_staleness`) is the one every trained row satisfied. The learner's importance corrections
take each token's behaviour log-prob and assume no K. Actors follow the buffer: their credit is what it
grants under the bound in force; only their own "too far behind for any credit" check reads the starting
K from the config, which is never above the buffer's, so at worst an actor whose credit wait ran out
waits for its next weights (it never re-asks in a loop).

Windows (`AutoStaleness`): SETTLE_STEPS steps are left out at the start (cold start: empty pipeline,
first weight push) and after an evaluation; K + 1 steps after a raise (the pipeline refills at the
new bound); then WINDOW_STEPS steps are averaged and `next_bound` decides.
"""

from __future__ import annotations

import math

TOLERANCE = 0.05  # the learner "does not wait" below this share of its busy time
WINDOW_STEPS = 5  # steps averaged per decision
SETTLE_STEPS = 3  # steps left out at the start and after an evaluation


def next_bound(k: int, wait_s: float, busy_s: float, cap: int, interval_before: float | None = None) -> int:
    """The bound for the next window (module docstring). k: the bound in force over the window (versions);
    wait_s, busy_s: the learner's mean wait and busy seconds per step over it; cap: the ceiling;
    interval_before: on the first window after a raise, the mean step interval (wait + busy) of the window
    that led to it (else None)."""
    if wait_s <= TOLERANCE * busy_s or k >= cap:
        return k
    if interval_before is not None and wait_s + busy_s >= (1 - TOLERANCE) * interval_before:
        return k  # the last raise did not shorten the step: the actors' throughput (or the cores) is the limit
    return min(cap, k + math.ceil((k + 1) * wait_s / max(busy_s, 1e-9)))


class AutoStaleness:
    """The driver's side: step times in, windows out, `next_bound` on each window. `k` is the bound to
    send with the next `set_version` (the buffer enforces it and reports it as `buffer/max_staleness`)."""

    def __init__(self, k: int, cap: int):
        self.k, self.cap = k, cap
        self.interval_before: float | None = None  # the step interval before the last raise, until its first window
        self.frozen = False  # a raise did not shorten the step: K stays until a window without waiting
        self.settle, self.window, self.first = SETTLE_STEPS, [], 0
        self.decided = False

    def resume(self, k: int) -> None:
        """Go on from the bound a resumed run's buffer restored (the K chosen before the stop), not from the
        configured start; the first window after it says the bound again."""
        self.k = max(self.k, k)

    def restart(self) -> None:
        """Leave the next SETTLE_STEPS steps out (an evaluation let the actors fill the pipeline)."""
        self.settle, self.window = SETTLE_STEPS, []

    def observe(self, step: int, wait_s: float, busy_s: float) -> str | None:
        """One step's wait and busy seconds; the console line when a window decides for the first time or
        raises K, else None."""
        if self.settle:
            self.settle -= 1
            return None
        self.first = self.first if self.window else step
        self.window.append((wait_s, busy_s))
        if len(self.window) < WINDOW_STEPS:
            return None
        wait = sum(w for w, _ in self.window) / len(self.window)
        busy = sum(b for _, b in self.window) / len(self.window)
        self.window = []
        waits = wait > TOLERANCE * busy
        k = self.k if self.frozen and waits else next_bound(self.k, wait, busy, self.cap, self.interval_before)
        line = None
        if k != self.k or not self.decided:
            line = (f"[staleness] auto: K={k} (learner waited {wait:.2f} s/step at K={self.k} over steps "
                    f"{self.first}-{step}, busy {busy:.2f} s/step; ceiling {self.cap})")
        if k > self.k:
            self.interval_before, self.settle, self.k = wait + busy, k + 1, k
        else:
            self.frozen = waits and (self.frozen or self.interval_before is not None)
            self.interval_before = None
        self.decided = True
        return line
