"""bench/evidence/evidence_traces.py and the testbed studies of bench/evidence/evidence_studies.py (golden values, no runs)."""

from __future__ import annotations

import pytest

from bench.common.stats import mean_se
from bench.evidence.evidence import samples_to
from bench.evidence.evidence_studies import STUDIES, config_file, run_overrides
from bench.evidence.evidence_traces import draw_traces, trace_rows, windows


def test_windows_average_each_period_and_skip_empty_ones():
    # width 2 over 6 steps: (0,2] = steps 1,2 -> (1+3)/2 = 2; (2,4] = step 3 only -> 5; (4,6] has no value
    assert windows({1: 1.0, 2: 3.0, 3: 5.0}, steps=6, width=2) == {2: 2.0, 4: 5.0}


def test_trace_rows_pair_the_first_and_last_window_by_seed():
    # seed 0: windows 0.2, 0.6 (change +0.4); seed 1: 0.4, 0.6 (+0.2). First: mean 0.3, SE = sd(0.2,0.4)/√2 = 0.1;
    # last: 0.6 ± 0; change +0.3 ± sd(0.4,0.2)/√2 = 0.1
    recs = [{"status": "ok", "traces": {"k": {1: 0.2, 2: 0.6}}}, {"status": "ok", "traces": {"k": {1: 0.4, 2: 0.6}}},
            {"status": "failed"}]
    rows = trace_rows(["arm"], {"arm": recs}, ["k", "absent"], steps=2, width=1)
    assert rows == [["arm", "`k`", "2", "0.300 ± 0.100 (steps 1–1)", "0.600 ± 0.000 (steps 2–2)", "+0.300 ± 0.100"]]
    assert mean_se([1.0, None]) == (1.0, None) and mean_se([]) == (None, None)


def test_an_arm_keeps_its_colour_on_a_panel_only_it_logs():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    recs = {"grpo": [{"status": "ok", "traces": {"shared": {1: 0.1}}}],
            "luffy": [{"status": "ok", "traces": {"shared": {1: 0.2}, "luffy/only": {1: 0.3}}}]}
    draw_traces(axes, ["grpo", "luffy"], recs, ["shared", "luffy/only"], steps=1, width=1)
    shared, only = ([line.get_color() for line in ax.get_lines()] for ax in axes)
    plt.close(fig)
    assert (shared, only) == (["C0", "C1"], ["C1"])  # before: the one-arm panel drew LUFFY in GRPO's C0


def test_samples_to_a_target_counts_the_seeds_that_reach_it():
    curve = [{"samples": 0, "accuracy": 0.5}, {"samples": 640, "accuracy": 0.6}, {"samples": 1280, "accuracy": 0.7}]
    recs = [{"status": "ok", "curve": curve}, {"status": "ok", "curve": [curve[0], {"samples": 640, "accuracy": 0.65}]}]
    # target 0.7: the first seed at 1280 samples, the second never (the start does not count)
    assert samples_to(recs, 0.7) == (1280, None, 1)
    assert samples_to(recs, 0.4) == (640, 0.0, 2)


def test_testbed_studies_start_every_seed_from_seed_0s_warm_model_and_prm():
    study = STUDIES["steps-hacking"]
    assert config_file(study).endswith("testbeds/steps.yaml")
    by_seed = [run_overrides(study, study.arms[1], seed) for seed in (0, 2)]
    paths = [[o for o in run if o.startswith(("model.path=", "pure.prm"))] for run in by_seed]
    assert paths[0] == paths[1] and [p.split("=")[0] for p in paths[0]] == ["model.path", "pure.prm", "pure.prm_path"]
    assert "seed=2" in by_seed[1] and "pure.c_vr=0.0" in by_seed[1] and "pure.credit=gamma" in by_seed[1]
    rloo = run_overrides(STUDIES["steps-dense"], STUDIES["steps-dense"].arms[0], 1)
    assert not any(o.startswith("pure.") for o in rloo)


@pytest.mark.parametrize("name", [n for n, s in STUDIES.items() if s.source])
def test_a_study_without_runs_reads_arms_its_source_study_has(name):
    study = STUDIES[name]
    source = STUDIES[study.source]
    assert {a.name: a for a in study.arms}.items() <= {a.name: a for a in source.arms}.items()
    assert (study.steps, study.eval_every, study.testbed) == (source.steps, source.eval_every, source.testbed)


def test_a_run_collapses_at_the_first_evaluation_at_or_below_half_its_start():
    from bench.evidence.evidence import analyse
    from tests.bench.test_evidence import _rows

    # start 0.30: half is 0.15; step 2's 0.16 is above it, step 4's 0.15 is not
    assert analyse(_rows({0: 0.30, 2: 0.16, 4: 0.15}), steps=4, threshold=0.1)["collapse_step"] == 4
    assert analyse(_rows({0: 0.30, 2: 0.16, 4: 0.20}), steps=4, threshold=0.1)["collapse_step"] is None
    assert analyse(_rows({0: 0.0, 2: 0.0, 4: 0.0}), steps=4, threshold=0.1)["collapse_step"] is None  # nothing to lose
