"""The arithmetic of the end-to-end benchmarks (bench/common/runs.py, bench/e2e/staleness.py, bench/e2e/learning.py) on
synthetic metrics rows and golden numbers worked out by hand in the comments."""

import json

import pytest

from bench.common.runs import (
    check_extras,
    ideal_bound,
    ideal_bound_sync_serial,
    load_rows,
    ratio,
    steady_state,
    steps_for_samples,
    training_clock,
)
from bench.e2e import learning, staleness
from configs.loading import resolve


def rows_with_clock(walls, rows_per_step=64, eval_after=(), eval_s=3.0, final_eval=None):
    """Step 0 = the evaluation before RL; then one training row per wall-clock reading."""
    out = [{"step": 0, "eval/accuracy": 0.2, "eval/n": 200, "time/eval_s": 5.0}]
    for k, w in enumerate(walls, 1):
        r = {"step": k, "batch/rows": rows_per_step, "time/wall_s": w, "time/train_s": 0.5,
             "time/generate_wait_s": 2.0, "time/weight_sync_s": 0.1}
        if k in eval_after:
            r |= {"eval/accuracy": 0.25, "eval/n": 200, "time/eval_s": eval_s}
        out.append(r)
    if final_eval is not None:  # the driver's extra row after the loop, same step as the last one
        out.append({"step": len(walls), "eval/accuracy": final_eval, "eval/n": 200, "time/eval_s": 2.0})
    return out


# Clock after steps 1..6: 10, 14, 18, 25, 29, 33 s; an evaluation of 3 s ran after step 3, so it lies in
# step 4's interval (18 → 25 = 4 s of step + 3 s of evaluation).
WALLS = [10.0, 14.0, 18.0, 25.0, 29.0, 33.0]


def test_steady_state_skips_warmup_and_the_step_holding_an_evaluation():
    rows = rows_with_clock(WALLS, eval_after={3})
    st = steady_state(rows, skip=1)
    # skip step 1 (cold start, 10 s); step 4 holds the evaluation → left out.
    # measured: steps 2, 3, 5, 6 = 4 intervals of 4 s = 16 s, 4 × 64 = 256 samples → 16.0 samples/s
    assert st.steps == [2, 3, 5, 6] and st.left_out == [4]
    assert st.samples == 256 and st.seconds == pytest.approx(16.0)
    assert st.samples_per_s == pytest.approx(16.0)
    # with no warm-up skipped, step 1 (10 s) joins: 320 samples / 26 s = 12.3077 samples/s
    assert steady_state(rows, skip=0).samples_per_s == pytest.approx(320 / 26)
    # K = 1 → settle 2: steps 4 and 5 left out (actors generated ahead during the evaluation);
    # measured 2, 3, 6 = 12 s for 192 samples → 16.0 samples/s
    st2 = steady_state(rows, skip=1, settle=2)
    assert st2.steps == [2, 3, 6] and st2.left_out == [4, 5] and st2.seconds == pytest.approx(12.0)


def test_steady_state_from_throughput_when_rows_have_no_wall_clock():
    # older rows: interval_k = batch/rows / throughput/samples_per_s; same intervals as above
    rows = rows_with_clock(WALLS, eval_after={3})
    intervals = [10.0, 4.0, 4.0, 7.0, 4.0, 4.0]
    for r, dt in zip(rows[1:], intervals):
        del r["time/wall_s"]
        r["throughput/samples_per_s"] = 64 / dt
    st = steady_state(rows, skip=1)
    assert st.steps == [2, 3, 5, 6] and st.samples_per_s == pytest.approx(16.0)


def test_training_clock_takes_evaluations_out_and_final_eval_row_merges(tmp_path):
    rows = rows_with_clock(WALLS, eval_after={3}, final_eval=0.31)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    merged = load_rows(tmp_path)
    assert [r["step"] for r in merged] == [0, 1, 2, 3, 4, 5, 6]  # the final evaluation joined step 6
    assert merged[-1]["eval/accuracy"] == 0.31 and merged[-1]["batch/rows"] == 64
    # clock: 10, 14, 18, then 25 − 3 s of evaluation = 22, 26, 30 (the final evaluation is after the loop)
    assert training_clock(merged) == pytest.approx({0: 0.0, 1: 10.0, 2: 14.0, 3: 18.0, 4: 22.0, 5: 26.0, 6: 30.0})


def test_ideal_bound_ratio_and_share_golden():
    # quick-start-like K=0 timings: T_gen = 3.0 s, T_train = 0.4 s + push 0.2 s = 0.6 s
    # bound = (3.0 + 0.6) / max(3.0, 0.6) = 3.6 / 3.0 = 1.2
    assert ideal_bound(3.0, 0.6) == pytest.approx(1.2)
    # push stalling both sides: (3.0 + 0.4 + 0.2) / (max(3.0, 0.4) + 0.2) = 3.6 / 3.2 = 1.125
    assert ideal_bound_sync_serial(3.0, 0.4, 0.2) == pytest.approx(1.125)
    # balanced phases double the rate at best; 1 s vs 3 s → 4/3
    assert ideal_bound(2.0, 2.0) == pytest.approx(2.0) and ideal_bound(1.0, 3.0) == pytest.approx(4 / 3)
    # K=0 at 20 samples/s, K=2 at 23 samples/s → ratio 1.15 → share of the bound 1.15 / 1.2 = 0.9583
    assert ratio(23.0, 20.0) == pytest.approx(1.15)
    assert ratio(ratio(23.0, 20.0), ideal_bound(3.0, 0.6)) == pytest.approx(0.958333, rel=1e-5)
    assert ratio(None, 20.0) is None and ratio(1.0, 0.0) is None
    with pytest.raises(ValueError):
        ideal_bound(0.0, 0.0)


def test_staleness_analyse_and_baseline_on_synthetic_runs():
    # K=0: every step 4 s = wait 3.0 + train 0.4 + push 0.2 + 0.4 s of bookkeeping; 64 samples → 16 samples/s
    def run(step_s, wait):
        rows = [{"step": 0, "eval/accuracy": 0.2, "eval/n": 200, "time/eval_s": 5.0}]
        for k in range(1, 9):
            rows.append({"step": k, "batch/rows": 64, "time/wall_s": step_s * k, "time/generate_wait_s": wait,
                         "time/train_s": 0.4, "time/weight_sync_s": 0.2, "is/ess": 0.99, "mismatch/kl": 0.01,
                         "staleness/mean": 1.0, "staleness/max": 2, "buffer/dropped_stale": 0})
        rows[-1] |= {"eval/accuracy": 0.3, "eval/n": 200, "time/eval_s": 2.0}
        return rows

    base = staleness.analyse(run(4.0, 3.0), steps=8, skip=2) | {"status": "ok"}
    assert base["samples_per_s"] == pytest.approx(16.0) and base["window_steps"] == 6  # steps 3..8
    assert base["t_other_s"] == pytest.approx(0.4) and base["accuracy_end"] == 0.3
    # K=2: 3.2 s per step → 20 samples/s; ratio 1.25; bound (3.0 + 0.6)/3.0 = 1.2 → share 1.0417
    rec = staleness.analyse(run(3.2, 0.01), steps=8, skip=2) | {"status": "ok"}
    staleness.add_baseline(rec, base)
    assert rec["ratio_vs_k0"] == pytest.approx(1.25)
    assert rec["ideal_bound"] == pytest.approx(1.2)
    assert rec["share_of_bound"] == pytest.approx(1.25 / 1.2)
    with pytest.raises(ValueError, match="expected 9"):
        staleness.analyse(run(4.0, 3.0), steps=9, skip=2)


def test_samples_to_steps():
    assert steps_for_samples(1920, 64) == 30  # exactly 30 steps of 8 prompts × 8
    assert steps_for_samples(2000, 64) == 32  # 31.25 → rounded up: never below the budget
    assert steps_for_samples(10, 64) == 1
    with pytest.raises(ValueError):
        steps_for_samples(100, 0)
    # shipped configs: PRIME/PURE 16 prompts × n=4, the others 8 × 8 — all 64 samples a step
    for algo in ("grpo", "prime", "pure", "luffy"):
        plan = learning.budget(resolve(algo), 1920)
        assert plan["samples_per_step"] == 64 and plan["steps"] == 30, (algo, plan)
    assert learning.budget(resolve("prime"), 1920)["batch_prompts"] == 16
    # LUFFY: 1 of the 8 rows of a group is the teacher's (prefix ratio 1); overrides are honoured
    assert learning.budget(resolve("luffy"), 1920)["demo_rows_per_group"] == 1
    small = learning.budget(resolve("grpo", overrides=["rollout.n=4", "learner.batch_prompts=4"]), 100)
    assert small["samples_per_step"] == 16 and small["steps"] == 7  # ceil(100 / 16) = 7


def test_extras_are_checked():
    assert check_extras(["rollout.n=4"], staleness.RESERVED) == ["rollout.n=4"]
    with pytest.raises(ValueError, match="--ks"):
        check_extras(["buffer.max_staleness=3"], staleness.RESERVED)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        check_extras(["rollout.n"], staleness.RESERVED)
