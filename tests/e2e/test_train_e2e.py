"""End to end: `algo-train` runs every algorithm asynchronously with 2 real vLLM actors (Ray), a real
buffer process, a real FSDP learner and real weight sync; a run resumes with no prompt trained twice.

Runs are small (groups of 4, 4 prompts a step, short responses) and start from the SFT-warmed tiny
model (built once per session, ~30 s), which scores often enough that advantages are not all zero
and the weights must move; learning itself is measured by the quick-start curves, not here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.e2e.helpers import (
    EXE,
    SMALL,
    assert_weights_changed,
    check_run,
    ledger,
    rows,
    session_processes,
    train,
)

pytestmark = pytest.mark.slow

ALGO_KEYS = {"rloo": "loss/pg", "prime": "prime/prm_loss", "pure": "pure/min_step_score",
             "luffy": "luffy/offpolicy_frac", "pacs": "pacs/bce", "grpo": "loss/pg"}


# rloo runs asynchronously with 2 actors in test_actor_restart_e2e.py (one vLLM start-up less)
@pytest.mark.parametrize("algo", ["prime", "pure", "luffy", "pacs"])
def test_every_algorithm_runs_async_with_two_actors(algo, tmp_path, model_cache):
    extra = ["--set", "buffer.acc_lo=0.0"] if algo == "prime" else []  # keep groups the model fails entirely
    if algo == "pure":  # also the bf16 delta weight sync end to end: pushes 1 and 3 dense, 2 a delta
        extra = ["--set", "model.dtype=bfloat16", "--set", "weight_sync.mode=delta", "--set", "weight_sync.full_every=2"]
    out = tmp_path / algo
    train(out, model_cache, "--algo", algo, "--actors", "2", "--steps", "3", "--max-staleness", "1", *extra)
    rows = check_run(out, 3, 1, ALGO_KEYS[algo])
    assert_weights_changed(out, 3, model_cache)
    if algo == "pure":  # row s reports the push of version s - 1 (it travelled during step s)
        pushed = {r["step"]: r.get("weight_sync/changed_frac") for r in rows}
        assert pushed[1] is None and pushed[2] == 1.0 and 0 < pushed[3] < 1, pushed


def test_ctrl_c_stops_cleanly_then_resume_trains_no_prompt_twice(tmp_path, model_cache):
    out = tmp_path / "grpo"
    cmd = [EXE, "--algo", "grpo", "--steps", "40", "--output", str(out), *SMALL,
           "--set", f"model.cache_dir={model_cache}", "--set", "logging.progress=plain"]
    # A terminal's Ctrl-C signals the whole foreground process group: do the same to a new session.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "metrics.jsonl").exists() and len([r for r in rows(out) if "loss/total" in r]) >= 3:
                break
            time.sleep(1)
        assert proc.poll() is None, f"run ended before it could be interrupted:\n{proc.stdout.read()[-4000:]}"
        os.killpg(proc.pid, signal.SIGINT)
        log, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, log[-4000:]
    assert "[stop]" in log and "[done]" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"] is True
    time.sleep(3)
    # the run lives in its own session (launch.supervisor): nothing of it, nor of ours, may survive
    assert session_processes(summary["driver_pid"]) == [], "processes left behind after Ctrl-C"
    assert session_processes(proc.pid) == []
    stopped_at = summary["step"]
    first = ledger(out, stopped_at)
    assert len(first) == stopped_at * 4 and len(set(first)) == len(first)

    # Continue the interrupted run for 2 more steps: exactly 2 steps of new prompts are added.
    proc2 = train(out, model_cache, "--algo", "grpo", "--steps", str(stopped_at + 2), "--resume", str(out))
    assert "[resume]" in proc2.stdout + proc2.stderr
    both = ledger(out, stopped_at + 2)
    assert len(both) == (stopped_at + 2) * 4 and len(set(both)) == len(both), "a prompt was trained twice"
    assert set(first) <= set(both)
    check_run(out, stopped_at + 2, 1, "loss/pg")
    assert_weights_changed(out, stopped_at + 2, model_cache)
