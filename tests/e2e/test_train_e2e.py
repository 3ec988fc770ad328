"""End to end: `algo-train` runs every algorithm asynchronously with 2 real vLLM actors (Ray), a real
buffer process, a real FSDP learner and real weight sync; a run resumes with no prompt trained twice.

Every run here is a user's run with their own model and data (`tests.e2e.real_model`, built once per
session in seconds, nothing downloaded): `--model` a random-init Qwen2 (head_dim 64, grouped-query
attention, q/k/v biases, tied embeddings) with a byte-level BPE tokenizer trained on MATH-500, `--data`
(and LUFFY's `--demos`) MATH-500 as shipped, math-verify rewards, PURE's PRM a random-init HF
token-classification model. Runs are small (groups of 4, 4 prompts a step, 48-token responses).
A random model scores 0, so its groups are all-fail and are kept (`buffer.acc_lo=0.0` for PRIME's
window filter); the weights must still move: PRIME's online PRM, PURE's PRM, PACS' BCE and LUFFY's
teacher row (MATH-500's solution, reward 1) give non-zero advantages, and GRPO, whose all-fail
advantages are 0, gets a small entropy bonus. Learning itself is measured by the quick-start curves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.e2e.helpers import (
    assert_quiet_console,
    assert_weights_changed_from,
    check_run,
    command,
    ledger,
    rows,
    session_processes,
    train,
    trained_rows,
)
from tests.e2e.real_model import RealAssets

pytestmark = pytest.mark.slow

ALGO_KEYS = {"rloo": "loss/pg", "prime": "prime/prm_loss", "pure": "pure/min_step_score",
             "luffy": "luffy/offpolicy_frac", "pacs": "pacs/bce", "grpo": "loss/pg"}


def user_args(assets: RealAssets, *args: str) -> list[str]:
    """The flags a user passes for their model and data, plus a logged sample every step."""
    return ["--model", str(assets.model), "--data", str(assets.data), "--set", "logging.samples_every=1", *args]


def algo_args(algo: str, assets: RealAssets) -> list[str]:
    if algo == "prime":
        return ["--set", "buffer.acc_lo=0.0"]  # keep the groups the model fails entirely
    if algo == "pure":  # the HF PRM; also the bf16 delta weight sync end to end: pushes 1 and 3 dense, 2 a delta.
        # A 7B-like lr: at 1e-6 few bf16 values move per step, so push 2 travels as a delta; at pure.yaml's 1e-4
        # most do, and a delta over half the elements is sent dense (weightsync.delta's fallback)
        return ["--set", "pure.prm=hf", "--set", f"pure.prm_path={assets.prm}", "--set", "model.dtype=bfloat16",
                "--set", "weight_sync.mode=delta", "--set", "weight_sync.full_every=2", "--set", "learner.lr=1e-6"]
    if algo == "luffy":
        return ["--demos", str(assets.data)]  # MATH-500's solutions are the teacher's
    return []


def check_user_run(out, log: str, assets: RealAssets, steps: int) -> None:
    """MATH-500 was read in its own layout, every reward call of math-verify succeeded, and samples.jsonl
    holds one decoded sample of each step, of a MATH-500 problem with its answer."""
    assert "layout problem/answer/solution" in log, log[-3000:]
    assert_quiet_console(log)
    assert "a reward call failed" not in log, log[-3000:]
    for r in trained_rows(out):
        assert r["reward/errors"] == 0 and r["reward/timeouts"] == 0, r
    answers = {}
    for line in assets.data.read_text().splitlines():
        row = json.loads(line)
        answers[row["problem"]] = row["answer"]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["step"] for s in samples}) == list(range(1, steps + 1)), samples
    for s in samples:
        problems = [p for p in answers if p in s["prompt"]]  # the prompt decoded through the chat template
        assert len(problems) == 1 and s["ground_truth"] == answers[problems[0]], s
        assert isinstance(s["response"], str) and s["response_tokens"] > 0 and s["reward"] in (0.0, 1.0), s


# rloo runs asynchronously with 2 actors in test_actor_restart_e2e.py (one vLLM start-up less); grpo in
# the Ctrl-C test below
@pytest.mark.parametrize("algo", ["prime", "pure", "luffy", "pacs"])
def test_every_algorithm_runs_async_with_two_actors(algo, tmp_path, real_assets):
    out = tmp_path / algo
    proc = train(out, None, "--algo", algo, "--actors", "2", "--steps", "3", "--max-staleness", "1",
                 *user_args(real_assets, *algo_args(algo, real_assets)))
    rows = check_run(out, 3, 1, ALGO_KEYS[algo])
    assert_weights_changed_from(real_assets.model, out, 3)
    check_user_run(out, proc.stdout + proc.stderr, real_assets, 3)
    if algo == "pure":  # row s reports the push of version s - 1 (it travelled during step s)
        pushed = {r["step"]: r.get("weight_sync/changed_frac") for r in rows}
        assert pushed[1] is None and pushed[2] == 1.0 and 0 < pushed[3] < 1, pushed
    if algo == "luffy":  # the teacher rows are MATH-500's own solutions: math-verify scores them 1
        assert all(r["luffy/reward_offpolicy"] == 1.0 for r in rows), rows


def test_ctrl_c_stops_cleanly_then_resume_trains_no_prompt_twice(tmp_path, real_assets):
    out = tmp_path / "grpo"
    args = user_args(real_assets, "--set", "loss.entropy_coef=0.01")  # all-fail groups: only the bonus moves it
    cmd = command(out, None, "--algo", "grpo", "--steps", "40", *args)
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
    proc2 = train(out, None, "--algo", "grpo", "--steps", str(stopped_at + 2), "--resume", str(out), *args)
    assert "[resume]" in proc2.stdout + proc2.stderr
    both = ledger(out, stopped_at + 2)
    assert len(both) == (stopped_at + 2) * 4 and len(set(both)) == len(both), "a prompt was trained twice"
    assert set(first) <= set(both)
    check_run(out, stopped_at + 2, 1, "loss/pg")
    assert_weights_changed_from(real_assets.model, out, stopped_at + 2)
    check_user_run(out, log + proc2.stdout + proc2.stderr, real_assets, stopped_at + 2)
