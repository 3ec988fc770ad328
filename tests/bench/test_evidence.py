"""bench/evidence/evidence.py's arithmetic on hand-made metrics rows (the runs themselves are real algo-train runs)."""

from __future__ import annotations

import pytest

from bench.evidence.evidence import STUDIES, analyse, paired, render, summarise


def _rows(accs: dict[int, float]) -> list[dict]:
    """4 training steps of 64 rows; wall clock 1, 2, 3.5, 4.5 s with a 0.5 s evaluation after step 2 (it lies
    in step 3's interval, bench/common/runs.py), evaluations at the steps of `accs` (step 0 = before RL)."""
    rows = [{"step": 0, "eval/accuracy": accs[0], "eval/n": 200}]
    for k, wall in zip((1, 2, 3, 4), (1.0, 2.0, 3.5, 4.5)):
        r = {"step": k, "time/train_s": 0.1, "batch/rows": 64, "time/wall_s": wall, "is/ess": 0.9 + k / 100}
        if k in accs:
            r |= {"eval/accuracy": accs[k], "eval/n": 200, "time/eval_s": 0.5 if k == 2 else 0.2}
        rows.append(r)
    return rows


def test_a_run_reaches_its_threshold_at_the_first_evaluation_at_or_above_start_plus_threshold():
    a = analyse(_rows({0: 0.30, 2: 0.35, 4: 0.45}), steps=4, threshold=0.10)
    # start 0.30 + 0.10 = 0.40: first reached at step 4, after 4 × 64 = 256 samples; training clock at step 4 =
    # 4.5 s of wall clock − the 0.5 s evaluation after step 2 = 4.0 s; 4.0 / 256 = 0.015625 s per sample
    assert a["samples_to_threshold"] == 256 and a["seconds_to_threshold"] == pytest.approx(4.0)
    assert a["s_per_sample"] == pytest.approx(4.0 / 256)
    assert (a["accuracy_before"], a["accuracy_end"], a["accuracy_best"]) == (0.30, 0.45, 0.45)
    assert a["ess"] == pytest.approx((0.91 + 0.92 + 0.93 + 0.94) / 4)
    never = analyse(_rows({0: 0.30, 2: 0.35, 4: 0.39}), steps=4, threshold=0.10)
    assert never["samples_to_threshold"] is None and never["seconds_to_threshold"] is None


def test_a_run_without_its_last_evaluation_or_with_missing_steps_is_refused():
    with pytest.raises(ValueError, match="last step"):
        analyse(_rows({0: 0.30, 2: 0.35}), steps=4, threshold=0.1)
    with pytest.raises(ValueError, match="expected 5"):
        analyse(_rows({0: 0.30, 4: 0.35}), steps=5, threshold=0.1)


def test_arms_summarise_over_seeds_and_pair_with_the_baseline_seed_by_seed():
    study = STUDIES["pacs"]
    recs = {
        "grpo": [{"seed": s, "status": "ok", **analyse(_rows({0: 0.3, 4: acc}), 4, 0.1)} for s, acc in ((0, 0.40), (1, 0.36))],
        "pacs-question": [{"seed": s, "status": "ok", **analyse(_rows({0: 0.3, 4: acc}), 4, 0.1)}
                          for s, acc in ((0, 0.44), (1, 0.42))] + [{"seed": 2, "status": "failed"}],
    }
    s = summarise(recs["pacs-question"])
    assert (s["seeds"], s["failed"]) == (2, 1)
    assert s["accuracy_end"][0] == pytest.approx(0.43) and s["gain"][0] == pytest.approx(0.13)
    # reached by both seeds (0.44, 0.42 ≥ 0.40) at step 4 = 256 samples
    assert s["samples_to_threshold"] == (256, 0.0, 2)
    d = paired(study, recs, "pacs-question")
    # differences 0.04 and 0.06: mean 0.05, seed SE = sd(0.04, 0.06)/√2 = 0.01414/1.414 = 0.01
    assert d["delta"] == pytest.approx(0.05) and d["sigma_seeds"] == pytest.approx(0.01)
    assert paired(study, recs, "grpo") is None  # the baseline against itself
    # the table's cell: σ = max(seed SE 0.01, binomial √(mean(0.44·0.56/200 + 0.40·0.60/200,
    # 0.42·0.58/200 + 0.36·0.64/200)/2) = √(0.0024010/2) = 0.034648); t = 0.05/0.034648 = 1.443 with 1 df:
    # p = 1 − (2/π)·atan(1.443) = 0.386
    assert d["t"] == pytest.approx(1.4431, abs=1e-4) and d["p"] == pytest.approx(0.3857, abs=1e-4)
    assert "+0.050 ± 0.035 (t = 1.44, df = 1, p = 0.39)" in render(study, recs, [0, 1, 2], "cmd")
