"""The arithmetic of bench/peers/peer_trl.py (ours vs TRL GRPOTrainer) on hand-made runs, golden values worked
out in the comments. No TRL, vLLM or run is needed (CI has no TRL)."""

import json
import sys

import pytest

from bench.common.runs import load_rows
from bench.peers import peer_trl
from bench.peers.peer_trl_report import (
    compare,
    interpolate,
    loop_start,
    render,
    run_curve,
    startup_s,
    time_to_reach,
)


def rows(walls, evals, final, eval_s_inside, before=0.2, pre_eval_s=5.0):
    """Step 0 = the evaluation before RL; one training row of 64 samples per wall-clock reading; `evals`
    maps a step to the accuracy evaluated after it (its time `eval_s_inside` lies in the next interval);
    `final` = the accuracy evaluated after the last step (in its own row, as algo-train writes it)."""
    out = [{"step": 0, "eval/accuracy": before, "eval/n": 200, "time/eval_s": pre_eval_s}]
    for k, w in enumerate(walls, 1):
        r = {"step": k, "batch/rows": 64, "time/wall_s": w, "time/train_s": 1.0}
        if k in evals:
            r |= {"eval/accuracy": evals[k], "eval/n": 200, "time/eval_s": eval_s_inside}
        out.append(r)
    out.append({"step": len(walls), "eval/accuracy": final, "eval/n": 200, "time/eval_s": 1.0})
    return out


# ours: loop clock 10, 20, 30, 40 s; an evaluation of 2 s after step 2 lies in step 3's interval, so the
# training clock is 10, 20, 28, 38 s. Curve: (0 samples, 0 s, 0.2), (128, 20 s, 0.4), (256, 38 s, 0.5).
OURS = rows([10.0, 20.0, 30.0, 40.0], {2: 0.4}, final=0.5, eval_s_inside=2.0)
# TRL: 20, 40, 60, 80 s with a 5 s evaluation after step 2: training clock 20, 40, 55, 75 s.
# Curve: (0, 0 s, 0.3), (128, 40 s, 0.45), (256, 75 s, 0.45).
TRL = rows([20.0, 40.0, 60.0, 80.0], {2: 0.45}, final=0.45, eval_s_inside=5.0, before=0.3, pre_eval_s=12.0)


def merged(rs):
    from bench.common.runs import merge_rows

    return merge_rows(rs)


def test_run_curve_reads_samples_training_clock_and_accuracy():
    o = run_curve(merged(OURS), 4)
    assert [(c["step"], c["samples"], c["train_s"], c["accuracy"]) for c in o["curve"]] == [
        (0, 0.0, 0.0, 0.2), (2, 128.0, 20.0, 0.4), (4, 256.0, 38.0, 0.5)]
    assert o["samples_per_s"] == pytest.approx(256 / 38)  # 6.7368 samples/s, the evaluation left out
    assert (o["acc_before"], o["acc_final"]) == (0.2, 0.5)
    t = run_curve(merged(TRL), 4)
    assert t["train_s"] == pytest.approx(75.0) and t["samples_per_s"] == pytest.approx(256 / 75)  # 3.4133


def test_interpolation_and_first_crossing():
    pts = [(0.0, 0.2), (20.0, 0.4), (38.0, 0.5)]
    assert interpolate(pts, 10.0) == pytest.approx(0.3)  # halfway from 0.2 to 0.4
    assert interpolate(pts, 29.0) == pytest.approx(0.45)  # 0.4 + 0.1 × 9/18
    assert interpolate(pts, 38.0) == pytest.approx(0.5)
    assert interpolate(pts, 39.0) is None and interpolate(pts, -1.0) is None  # never extrapolated
    assert time_to_reach(pts, 0.45) == pytest.approx(29.0)  # inside (20, 38]: 20 + 18 × 0.05/0.1
    assert time_to_reach(pts, 0.2) == 0.0  # reached at the start
    assert time_to_reach(pts, 0.51) is None
    # a dip and a recovery: the FIRST crossing counts (0.5 first reached at x = 10)
    assert time_to_reach([(0, 0.2), (10, 0.5), (20, 0.3), (30, 0.6)], 0.5) == 10


def test_startup_from_stamped_lines_and_timing():
    lines = [(1000.0, "$ algo-train ..."), (1030.0, "[eval] held-out accuracy before RL: 0.380"),
             (1052.5, "23:00:00 step 1/4 | 12.0 samples/s | reward 0.20"), (1060.0, "23:00:08 step 2/4 | ...")]
    # step 1's line at 1052.5 s, 10 s after the loop started: loop start 1042.5; minus process start 1000
    # and the 5 s evaluation before RL = 37.5 s
    assert loop_start(lines, 10.0) == pytest.approx(1042.5)
    assert startup_s(1000.0, loop_start(lines, 10.0), 5.0) == pytest.approx(37.5)
    assert loop_start([(1.0, "step 11/40")], 1.0) is None  # step 11 is not step 1
    assert startup_s(2000.0, 2060.0, 12.0) == pytest.approx(48.0)  # TRL: train_start − start − pre-RL eval


def test_compare_golden_values_and_table():
    o = run_curve(merged(OURS), 4) | {"startup_s": 37.5, "pre_eval_s": 5.0}
    t = run_curve(merged(TRL), 4) | {"startup_s": 48.0, "pre_eval_s": 12.0}
    c = compare(o, t)
    assert c["throughput_ratio"] == pytest.approx(75 / 38)  # (256/38) / (256/75) = 1.9737
    # ours reaches TRL's final 0.45 at 29 s of training; TRL never reaches ours' 0.5
    assert c["time_to_other_final"][0] == pytest.approx(29.0) and c["time_to_other_final"][1] is None
    # from process start: + ours' 37.5 s start-up = 66.5 s; TRL still never
    assert c["time_to_other_final_e2e"][0] == pytest.approx(66.5) and c["time_to_other_final_e2e"][1] is None
    s, acc_o, acc_t = c["equal_samples"]  # both ran 256 samples: the final accuracies
    assert (s, acc_o, acc_t) == (256.0, pytest.approx(0.5), pytest.approx(0.45))
    w, acc_o, acc_t = c["equal_wall"]  # 38 s (ours' whole loop): TRL at 0.3 + 0.15 × 38/40 = 0.4425
    assert w == pytest.approx(38.0) and acc_o == pytest.approx(0.5) and acc_t == pytest.approx(0.4425)
    table = render(c)
    assert "ours/TRL 1.97" in table and "| 29 s | not reached |" in table
    assert "accuracy at equal samples (256) | 0.500 | 0.450 | ours−TRL +0.050" in table
    assert "| 38 s | 48 s | ours/TRL 0.78 |" in table  # 37.5 s → "38 s" (round half to even)


def test_the_bench_reads_both_run_folders_without_trl(tmp_path):
    """analyse_ours / analyse_trl on folders laid out as algo-train and bench/peers/peer_trl_run.py write them."""
    ours, trl = tmp_path / "ours", tmp_path / "trl"
    for d, rs in ((ours, OURS), (trl, TRL)):
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    (tmp_path / "ours.log").write_text("1000.000 $ algo-train --algo grpo\n1052.500 23:00:00 step 1/4 | x\n")
    (trl / "timing.json").write_text(json.dumps({"process_start": 2000.0, "train_start": 2060.0,
                                                 "pre_eval_s": 12.0, "chat_template_same_ids": True}))
    a = peer_trl.analyse_ours(ours, tmp_path / "ours.log", 4)
    b = peer_trl.analyse_trl(trl, 4)
    assert a["startup_s"] == pytest.approx(1052.5 - 10.0 - 1000.0 - 5.0)  # 37.5
    assert b["startup_s"] == pytest.approx(48.0) and b["chat_template_same_ids"] is True
    assert len(load_rows(ours)) == 5  # the final evaluation merged into step 4's row
    assert a["layout"] is None  # no config.yaml
    from configs.loading import dump_annotated, resolve

    (ours / "config.yaml").write_text(dump_annotated(resolve("grpo", overrides=["rollout.num_actors=2", "buffer.max_staleness=1"])))
    assert peer_trl.layout_of(ours) == {"actors": 2, "prompts_in_flight": 16, "cpus_per_actor": 0.5,
                                        "micro_batch_samples": 32, "rows": 64, "max_staleness": 1}
    # with max_staleness: auto the run chose K: the layout says the bound in force at its last step
    (ours / "config.yaml").write_text(dump_annotated(resolve("grpo", overrides=["buffer.max_staleness=auto"])))
    with (ours / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 2, "buffer/max_staleness": 3}) + "\n")
    lay = peer_trl.layout_of(ours)
    assert lay["max_staleness"] == 3 and lay["k_chosen"] == "`max_staleness: auto` chose K: from 1, at most 4"
    assert "up to K = 3 version(s) stale" in peer_trl.unmatched(lay)[0] and "auto` chose K" in peer_trl.unmatched(lay)[0]
    assert "trl" not in sys.modules  # the bench's analysis never imports TRL


def test_the_section_says_what_is_matched_and_not(tmp_path):
    o = run_curve(merged(OURS), 4) | {"startup_s": 37.5, "pre_eval_s": 5.0}
    t = run_curve(merged(TRL), 4) | {"startup_s": 48.0, "pre_eval_s": 12.0}
    args = peer_trl.parse_args(["--steps", "4", "--out-dir", str(tmp_path), "--extra", "buffer.max_staleness=auto"])
    assert peer_trl.ours_overrides(args) == ["seed=0", "buffer.max_staleness=auto"]
    with pytest.raises(SystemExit):  # the bench sets the seed itself
        peer_trl.parse_args(["--extra", "seed=3"])
    meta = {"label": "smoke", "steps": 4, "date": "today", "machine": {"cpus": 2}, "load": [1, 2, 3],
            "command": "python bench/peers/peer_trl.py --steps 4", "versions": "trl x"}
    text = peer_trl.section(args, compare(o, t), o, t, meta)
    assert "smoke run, not the result" in text and "`python bench/peers/peer_trl.py --steps 4`" in text
    assert "Matched:" in text and "Not matched" in text and "noisy" in text
    assert "| ours (algo-train, async) |" in text and "ours runs ? vLLM engine(s)" in text  # no config.yaml
    o["layout"] = {"actors": 1, "prompts_in_flight": 16, "cpus_per_actor": 0.5, "micro_batch_samples": 32,
                   "rows": 64, "max_staleness": 1}
    text = peer_trl.section(args, compare(o, t), o, t, meta)  # the layout is said as our run had it
    assert "| ours (algo-train, async, 1 actor) |" in text and "up to K = 1 version(s) stale" in text
    assert "ours runs 1 vLLM engine(s), one per actor process (0.5 core reserved and 16 prompts in flight" in text
    assert "ours 2 micro-batches of up to 32 rows a step (gradient accumulated), TRL one 64-row forward" in text


def test_trls_engine_gets_the_forced_engine_arguments():
    """bench/peers/peer_trl_run.py builds TRL's colocated LLM with the run's dtype: TRL passes none, and vLLM's
    "auto" would run a float32 checkpoint in bfloat16."""
    from bench.peers.peer_trl_run import matched_llm

    class FakeLLM:
        def __init__(self, *a, **kw):
            self.a, self.kw = a, kw

    llm = matched_llm(FakeLLM, dtype="float32")(model="m", dtype="auto", seed=0)
    assert llm.kw == {"model": "m", "dtype": "float32", "seed": 0} and isinstance(llm, FakeLLM)
    assert matched_llm(FakeLLM, dtype="float32", enforce_eager=True)("m").kw == {"dtype": "float32",
                                                                               "enforce_eager": True}


def test_serving_threads_holds_for_each_generate_and_restores():
    """TRL's engine generates on the given torch threads (set through torch._C, as vLLM's CPU worker has made
    torch.set_num_threads a no-op) and the trainer's count comes back after, also when generate raises."""
    import torch

    from bench.peers.peer_trl_run import serving_threads

    class FakeLLM:
        seen = []

        def generate(self, prompts, fail=False):
            self.seen.append(torch.get_num_threads())
            if fail:
                raise RuntimeError("engine died")
            return prompts

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        llm = FakeLLM()
        serving_threads(llm, 1)
        assert llm.generate(["p"]) == ["p"] and llm.seen == [1] and torch.get_num_threads() == 2
        with pytest.raises(RuntimeError):
            llm.generate(["p"], fail=True)
        assert llm.seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
