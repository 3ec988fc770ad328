"""bench/e2e/ab.py's arithmetic: the ratio is taken within each A-then-B pair, a pair with a failed run counts
for nothing."""

from bench.e2e.ab import summarise


def run(pair, side, sps, status="ok"):
    return {"pair": pair, "side": side, "samples_per_s": sps, "status": status}


def test_ratios_are_taken_within_pairs_and_the_median_is_the_result():
    # pair 0 on a quiet machine (100 -> 120: 1.2), pair 1 at half speed (50 -> 55: 1.1), pair 2 (80 -> 120: 1.5)
    s = summarise([run(0, "a", 100), run(0, "b", 120), run(1, "a", 50), run(1, "b", 55),
                   run(2, "a", 80), run(2, "b", 120)])
    assert [round(r, 6) for r in s["ratios"]] == [1.2, 1.1, 1.5]
    assert round(s["median_ratio"], 6) == 1.2
    assert round(s["mean_a"], 6) == round((100 + 50 + 80) / 3, 6) and round(s["mean_b"], 6) == round(295 / 3, 6)


def test_a_pair_with_a_failed_run_gives_no_ratio():
    s = summarise([run(0, "a", 100), run(0, "b", None, status="failed"), run(1, "a", 50), run(1, "b", 60)])
    assert [round(r, 6) for r in s["ratios"]] == [1.2] and s["mean_b"] == 60
    assert summarise([run(0, "a", 100, status="failed"), run(0, "b", 90)])["median_ratio"] is None
