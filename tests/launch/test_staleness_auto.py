"""`max_staleness: auto` (launch/loop/staleness_auto.py): the rule by hand, against the pipeline model it is
derived from, and the window bookkeeping the driver runs."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from launch.loop.staleness_auto import SETTLE_STEPS, WINDOW_STEPS, AutoStaleness, next_bound


def model_wait(g: float, busy: float, k: int) -> float:
    """The steady-state wait per step of the module docstring: w = max(0, G − K·(w + L))."""
    return max(0.0, (g - k * busy) / (k + 1))


def test_golden():
    # the quick-start's timings (bench/RESULTS.md): G = 0.68 s, L = 0.45 s -> K=1 waits 0.115 s -> K = 2
    assert next_bound(1, wait_s=0.115, busy_s=0.45, cap=4) == 2
    assert next_bound(0, wait_s=0.68, busy_s=0.45, cap=4) == 2  # from the synchronous run: ceil(G / L)
    assert next_bound(1, wait_s=0.002, busy_s=1.9, cap=4) == 1  # learner-heavy: K=1 already stops the wait
    assert next_bound(1, wait_s=3.0, busy_s=0.5, cap=4) == 4  # ceil(13 / 1) capped at the ceiling
    assert next_bound(4, wait_s=3.0, busy_s=0.5, cap=4) == 4
    # the first window after a raise, against the step interval before it (0.3 + 0.5 = 0.8 s)
    assert next_bound(2, wait_s=0.3, busy_s=0.5, cap=8, interval_before=0.8) == 2  # the raise did not help
    assert next_bound(2, wait_s=0.1, busy_s=0.5, cap=8, interval_before=0.8) == 3  # 0.6 s: it did, not enough
    # learner-heavy on 2 cores (bench/RESULTS.md): K=1 waited 0.46 s, busy 2.79 s -> 1 + ceil(2·0.46/2.79) = 2;
    # at K=2 the wait fell to 0.18 s but busy grew to 3.52 s: P 3.70 s ≥ 0.95 × 3.25 s, so K stays 2
    # (a rule on the wait alone raised it to 2 + ceil(3·0.18/3.52) = 3, and the run slowed to 19.6 samples/s)
    assert next_bound(1, wait_s=0.46, busy_s=2.79, cap=4) == 2
    assert next_bound(2, wait_s=0.18, busy_s=3.52, cap=4, interval_before=3.25) == 2


@given(g=st.floats(0.01, 20), busy=st.floats(0.05, 5), k=st.integers(0, 6), cap=st.integers(0, 8))
def test_one_window_lands_on_the_smallest_bound_without_waiting(g, busy, k, cap):
    """Under the model the rule reaches, from any K, min(cap, the smallest K' ≥ K with G ≤ K'·L) in one
    window; it never lowers K nor passes the cap; at that bound the learner waits no more."""
    w = model_wait(g, busy, k)
    got = next_bound(k, w, busy, cap)
    smallest = max(k, math.ceil(g / busy - 1e-9))
    assert k <= got <= max(k, cap)
    if w > 0.05 * busy and k < cap:  # it waits: a raise, to exactly the bound the model asks for
        assert got == min(cap, smallest) or abs(g / busy - round(g / busy)) < 1e-6  # float ties at ceil
        assert got == cap or model_wait(g, busy, got) <= 1e-9 * g
    else:
        assert got == k


def feed(auto: AutoStaleness, steps: range, wait, busy: float) -> list[str]:
    return [line for s in steps if (line := auto.observe(s, wait(auto.k), busy))]


def test_the_driver_side_settles_decides_and_reports_once_per_change():
    g, busy = 1.4, 0.5  # needs K = 3
    auto = AutoStaleness(k=1, cap=4)
    lines = feed(auto, range(1, SETTLE_STEPS + WINDOW_STEPS + 1), lambda k: model_wait(g, busy, k), busy)
    assert auto.k == 3 and len(lines) == 1
    assert lines[0] == (f"[staleness] auto: K=3 (learner waited 0.45 s/step at K=1 over steps {SETTLE_STEPS + 1}-"
                        f"{SETTLE_STEPS + WINDOW_STEPS}, busy 0.50 s/step; ceiling 4)")
    assert feed(auto, range(100, 130), lambda k: model_wait(g, busy, k), busy) == []  # no wait at K=3: quiet
    assert auto.interval_before is None
    g = 2.4  # responses got longer: the learner waits again -> raised to the ceiling
    assert feed(auto, range(200, 220), lambda k: model_wait(g, busy, k), busy)[0].startswith("[staleness] auto: K=4")


def test_a_raise_that_does_not_shorten_the_wait_is_not_repeated():
    auto = AutoStaleness(k=1, cap=8)
    lines = feed(auto, range(1, 60), lambda k: 0.3, 0.5)  # throughput-bound: the same wait at every K
    assert auto.k == 3 and len(lines) == 1 and auto.frozen  # one raise (1 + ceil(2·0.3/0.5)), then K stays
    # (10 steps hold at least one whole window of each)
    assert feed(auto, range(60, 70), lambda k: 0.1, 0.5) == [] and auto.k == 3  # a lower wait at the same K
    assert feed(auto, range(70, 80), lambda k: 0.0, 0.5) == [] and not auto.frozen  # no wait: unfrozen
    assert feed(auto, range(80, 90), lambda k: 0.3, 0.5)[0].startswith("[staleness] auto: K=5")  # waits again


def test_a_raise_that_slows_the_learner_by_more_than_it_saves_in_waiting_is_not_repeated():
    """Actors and learner on the same cores: the raise took the wait down and the busy time up by more."""
    auto = AutoStaleness(k=1, cap=4)
    busy_at = {1: 2.79, 2: 3.52, 3: 4.0}
    lines = [line for s in range(1, 60) if (line := auto.observe(s, {1: 0.46, 2: 0.18, 3: 0.05}[auto.k],
                                                                    busy_at[auto.k]))]
    assert auto.k == 2 and auto.frozen and len(lines) == 1 and lines[0].startswith("[staleness] auto: K=2")


def test_an_evaluation_restarts_the_window():
    auto = AutoStaleness(k=1, cap=4)
    feed(auto, range(1, SETTLE_STEPS + WINDOW_STEPS), lambda k: 0.3, 0.5)  # one step short of a window
    auto.restart()
    assert feed(auto, range(10, 10 + SETTLE_STEPS + WINDOW_STEPS - 1), lambda k: 0.3, 0.5) == [] and auto.k == 1


def test_a_resumed_run_goes_on_from_the_bound_its_buffer_restored_and_says_it_again():
    auto = AutoStaleness(1, 4)
    auto.resume(3)  # the restored buffer's max_staleness: K=3 was chosen before the stop
    assert auto.k == 3
    auto.resume(1)  # never lowered (a buffer from an older snapshot reports the configured start)
    assert auto.k == 3
    for step in range(1, 4):  # the settle steps
        assert auto.observe(step, 0.0, 1.0) is None
    lines = [auto.observe(step, 0.0, 1.0) for step in range(4, 9)]  # a window without waiting
    assert lines[-1] == "[staleness] auto: K=3 (learner waited 0.00 s/step at K=3 over steps 4-8, busy 1.00 s/step; ceiling 4)"
