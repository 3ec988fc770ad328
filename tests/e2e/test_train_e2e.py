"""End to end: `algo-train` runs PRIME and LUFFY at the same time (two runs on one machine, one real vLLM actor
each), and PURE with two learner ranks and 2 actors, a stranger probing its ports, Ctrl-C and `--resume` (no
prompt trained twice); each with its actors under Ray, a real buffer process, a real FSDP learner and real
weight sync.

Every run here is a user's run with their own model and data (`tests.e2e.real_model`, built once per
session in seconds, nothing downloaded): `--model` a random-init Qwen2 (head_dim 64, grouped-query
attention, q/k/v biases, tied embeddings) with a byte-level BPE tokenizer trained on MATH-500, `--data`
(and LUFFY's `--demos`) MATH-500 as shipped, math-verify rewards (LUFFY's called through a veRL user's
`compute_score`; PRIME's instead a TRL user's batched function that the test recomputes:
`tests.e2e.field_rewards`), PURE's PRM a random-init HF token-classification model. Runs are small
(groups of 4, 4 prompts a step, 48-token responses). A random model scores 0 by math-verify, so its
groups are all-fail and are kept (`buffer.acc_lo=0.0` for PRIME's
window filter); the weights must still move: PRIME's online PRM, PURE's PRM and LUFFY's teacher row
(MATH-500's solution, reward 1) give non-zero advantages. Learning itself is measured by the quick-start
curves.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.stranger import Stranger, stranger_env, stranger_namespace
from tests.e2e.helpers import (
    assert_quiet_console,
    assert_weights_changed_from,
    check_run,
    command,
    ledger,
    session_processes,
    train,
    trained_rows,
)
from tests.e2e.real_model import RealAssets

FIELD_REWARDS = Path(__file__).with_name("field_rewards.py")

pytestmark = pytest.mark.slow

ALGO_KEYS = {"rloo": "loss/pg", "prime": "prime/prm_loss", "pure": "pure/min_step_score",
             "luffy": "luffy/offpolicy_frac", "pacs": "pacs/bce", "grpo": "loss/pg"}


def user_args(assets: RealAssets, *args: str) -> list[str]:
    """The flags a user passes for their model and data, plus a logged sample every step."""
    return ["--model", str(assets.model), "--data", str(assets.data), "--set", "logging.samples_every=1", *args]


def algo_args(algo: str, assets: RealAssets) -> list[str]:
    if algo == "prime":
        return ["--set", "buffer.acc_lo=0.0",  # keep the groups the model fails entirely
                "--set", f"reward.fn={FIELD_REWARDS}:group_parity"]  # a TRL user's batched reward
    if algo == "pure":  # the HF PRM; also the bf16 delta weight sync end to end: pushes 1 and 3 dense, 2 a delta.
        # A 7B-like lr: at 1e-6 few bf16 values move per step, so push 2 travels as a delta; at pure.yaml's 1e-4
        # most do, and a delta over half the elements is sent dense (weightsync.delta's fallback)
        return ["--set", "pure.prm=hf", "--set", f"pure.prm_path={assets.prm}", "--set", "model.dtype=bfloat16",
                "--set", "weight_sync.mode=delta", "--set", "weight_sync.full_every=2", "--set", "learner.lr=1e-6"]
    if algo == "luffy":
        return ["--demos", str(assets.data),  # MATH-500's solutions are the teacher's
                "--set", f"reward.fn={FIELD_REWARDS}:compute_score"]  # a veRL user's reward
    return []


def check_user_run(out, log: str, assets: RealAssets, steps: int) -> None:
    """MATH-500 was read in its own layout, every reward call succeeded, and samples.jsonl
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


def check_group_parity(out, assets: RealAssets) -> None:
    """PRIME's TRL-style reward (`field_rewards.group_parity`) was given whole groups (rollout.n = 4 completions
    a call) with MATH-500's id column: each logged sample's reward is recomputed from its response, its
    ground truth and its problem's id -- 1.0 iff len(response) + len(ground truth) + len(id) is a multiple of 4."""
    ids = {}
    for line in assets.data.read_text().splitlines():
        row = json.loads(line)
        ids[row["problem"]] = row["id"]
    for s in [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]:
        (problem,) = [p for p in ids if p in s["prompt"]]
        assert s["reward"] == float((len(s["response"]) + len(s["ground_truth"]) + len(ids[problem])) % 4 == 0), s


# Where each algorithm runs end to end: grpo across two hosts (tests/cluster) and in the quick-start, rloo
# in test_fleet_e2e.py, pacs --serial (test_serial_e2e.py), pure in the Ctrl-C run below, prime
# and luffy here, at the same time.
def test_two_runs_at_once_prime_and_luffy_both_finish(tmp_path, real_assets):
    """Two users' runs on one machine at once, each with an actor under a local Ray of its own: ports, Ray
    clusters, tokens and caches do not collide, and each run checks out as if it had run alone (one actor each:
    several actors per run are the Ctrl-C run's, tests/e2e/test_fleet_e2e.py's and tests/cluster's). LUFFY starts
    once PRIME's Ray is up (two Rays starting in the same seconds on a loaded 2-core machine can miss Ray's
    fixed 30 s raylet registration; `launch.planning.cluster.start_local_ray` retries once)."""
    runs = {}
    for algo in ("prime", "luffy"):
        if runs:
            _, first_log, first = runs["prime"]
            deadline = time.monotonic() + 180
            while "[graph] buffer at" not in first_log.read_text() and first.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
        out, log = tmp_path / algo, tmp_path / f"{algo}.log"
        argv = command(out, None, "--algo", algo, "--actors", "1", "--steps", "3", "--max-staleness", "1",
                       *user_args(real_assets, *algo_args(algo, real_assets)))
        with open(log, "w") as sink:
            runs[algo] = (out, log, subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                                     env=dict(os.environ, RAY_DEDUP_LOGS="1")))
    try:
        for algo, (out, log, proc) in runs.items():
            proc.wait(timeout=600)
            text = log.read_text()
            assert proc.returncode == 0, f"{algo}:\n{text[-5000:]}"
            rows = check_run(out, 3, 1, ALGO_KEYS[algo])
            assert_weights_changed_from(real_assets.model, out, 3)
            check_user_run(out, text, real_assets, 3)
            if algo == "prime":
                check_group_parity(out, real_assets)
            # the teacher rows are MATH-500's own solutions: math-verify scores them 1, through the veRL-style
            # compute_score only when it is given the row's data_source and extra_info (and its dict read)
            if algo == "luffy":
                assert all(r["luffy/reward_offpolicy"] == 1.0 for r in rows), rows
    finally:
        for _, _, proc in runs.values():
            if proc.poll() is None:
                proc.kill()


def test_ctrl_c_stops_cleanly_then_resume_trains_no_prompt_twice(tmp_path, real_assets):
    """PURE with its HF PRM, bf16 delta weight pushes, two learner ranks and two actors. While it trains, a
    stranger in another network namespace probes every port it listens on (`tests.cluster.stranger`; skipped
    where namespaces cannot be made); then Ctrl-C, and `--resume` trains 2 more steps on the sharded
    checkpoint: no prompt is trained twice."""
    out, log = tmp_path / "pure", tmp_path / "pure.log"
    args = user_args(real_assets, *algo_args("pure", real_assets), "--set", "learner.world_size=2",
                     "--set", "learner.cpus_per_rank=0.5", "--max-staleness", "1")
    cmd = command(out, None, "--algo", "pure", "--actors", "2", "--steps", "40", *args)
    with stranger_namespace() as ns:
        # A terminal's Ctrl-C signals the whole foreground process group: do the same to a new session.
        with open(log, "w") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                    env=stranger_env() | {"RAY_DEDUP_LOGS": "1"})
        stranger = Stranger(ns, proc.pid) if ns else None
        try:
            deadline = time.monotonic() + 900  # a hang guard: a loaded 2-core machine needs minutes to start two ranks and two engines
            while time.monotonic() < deadline and proc.poll() is None:
                trained = len(trained_rows(out))
                if stranger is not None:
                    stranger.sample()
                    if trained and not stranger.probed:  # every service is up: the first push is done
                        stranger.probe(tmp_path / "home")
                        continue
                if trained >= 3:
                    break
                time.sleep(0.5)
            assert proc.poll() is None, f"run ended before it could be interrupted:\n{log.read_text()[-4000:]}"
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert proc.returncode == 130, text[-4000:]
    assert "[stop]" in text and "[done]" in text
    if stranger is not None:
        stranger.check()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"] is True
    time.sleep(3)
    # the run lives in its own session (launch.commands.supervisor): nothing of it, nor of ours, may survive
    assert session_processes(summary["driver_pid"]) == [], "processes left behind after Ctrl-C"
    assert session_processes(proc.pid) == []
    stopped_at = summary["step"]
    first = ledger(out, stopped_at)
    assert len(first) == stopped_at * 4 and len(set(first)) == len(first)
    # row s reports the push of version s - 1 (it travelled during step s): 1 and 3 full, 2 a delta
    pushed = {r["step"]: r.get("weight_sync/changed_frac") for r in trained_rows(out) if r["step"] <= 3}
    assert pushed[1] is None and pushed[2] == 1.0 and 0 < pushed[3] < 1, pushed

    # Continue the interrupted run for 2 more steps by running its own command again (a Slurm requeue;
    # only --steps differs, which a resume may change): exactly 2 steps of new prompts are added.
    proc2 = train(out, None, "--algo", "pure", "--actors", "2", "--steps", str(stopped_at + 2), *args)
    assert "holds this command's run" in proc2.stdout + proc2.stderr, (proc2.stdout + proc2.stderr)[-4000:]
    both = ledger(out, stopped_at + 2)
    assert len(both) == (stopped_at + 2) * 4 and len(set(both)) == len(both), "a prompt was trained twice"
    assert set(first) <= set(both)
    check_run(out, stopped_at + 2, 1, ALGO_KEYS["pure"])
    assert_weights_changed_from(real_assets.model, out, stopped_at + 2)
    check_user_run(out, text + proc2.stdout + proc2.stderr, real_assets, stopped_at + 2)
