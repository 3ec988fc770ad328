"""End to end: an actor that crashes is restarted in the background while the other actor's groups are
trained, joins at the current weights, and its unfinished prompts are generated again; then the buffer
process is killed and restarted from its snapshot; the run goes on.

A real RLOO run (2 vLLM actors under Ray; this is also the suite's asynchronous RLOO run) trains a few steps, then actor 0's process is SIGKILLed (as
the OOM killer would). The run must finish every step with exit 0, say in its log that it restarted
actor 0, never train a row above the staleness bound, never train a prompt twice (the checkpoint's
ledger), leave no engine process of the dead actor behind, and the restarted actor must generate:
its shard's prompts are trained again, at steps its predecessor could not have fed within the bound.
A few steps later the buffer process (found in the run's processes.json) is SIGKILLed too: the driver
restarts it from its latest snapshot (taken every 2 s here), the actors reconnect, `buffer/restarts`
counts it, and the ledger still shows every trained prompt exactly once.

What the console says of each kill is one line of ours naming the process (pid, host, log file) and
what the run did, and nothing else: no Ray lines (they are in run_dir/logs/ray.log), no buffer warnings
(run_dir/logs/buffer.log), no separate line for the weight push the dead actor failed. (The learner
rank's kill: tests/launch/test_fault_console.py.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import (
    UNTRAINED,
    alive,
    assert_keys_documented,
    assert_quiet_console,
    assert_weights_changed,
    check_run,
    command,
    descendants,
    ledger_state,
    processes,
    run_session,
    wait_for_trained_rows,
)

pytestmark = pytest.mark.slow

STEPS = 90  # room after the join: the surviving actor alone trained 26 steps during a 14 s restart here
KILL_AFTER = 2  # trained steps before the kill
K = 1  # max_staleness
HOST = re.escape(socket.gethostname())  # where every process of this one-machine run is


def _wait_for_text(log, pattern: str, proc: subprocess.Popen, timeout_s: float) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text())
        if m or proc.poll() is not None:
            break
        time.sleep(0.5)
    m = re.search(pattern, log.read_text())
    assert m, f"no {pattern!r} in the run's log (exit {proc.poll()}):\n{log.read_text()[-5000:]}"
    return m


def test_killed_actor_is_restarted_resynced_and_its_prompts_regenerated(tmp_path, model_cache):
    out, log = tmp_path / "crash", tmp_path / "crash.log"
    cmd = command(out, model_cache, "--algo", "rloo", "--actors", "2", "--steps", str(STEPS),
                  "--max-staleness", str(K), "--set", "buffer.snapshot_every_s=2", *UNTRAINED)
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, RAY_DEDUP_LOGS="1"))
    sid = None
    try:
        sid = run_session(proc.pid)
        pids = [int(p) for p in _wait_for_text(log, r"actor\(s\) up in \d+s \(pids ([\d, ]+)\)", proc, 600)
                .group(1).split(", ")]
        assert len(pids) == 2
        victim = pids[0]
        (victim_args,) = [args for pid, _, s, args in processes() if pid == victim and s == sid]
        assert victim_args.startswith("ray::ActorRole"), victim_args
        engine = [pid for pid, args in descendants(victim) if "VLLM" in args or "EngineCore" in args]
        assert engine, f"actor 0 (pid {victim}) has no engine process: {descendants(victim)}"
        # forked from the actor (actors.engine_fork), not spawned: a fork's /proc environ is its parent's
        # memory; a spawned engine's is its own exec's, with vLLM's VLLM_WORKER_MULTIPROC_METHOD=spawn
        assert all(Path(f"/proc/{p}/environ").read_bytes() == Path(f"/proc/{victim}/environ").read_bytes()
                   for p in engine), "the engine core was spawned, not forked from the actor"

        wait_for_trained_rows(out, KILL_AFTER, proc, log)
        os.kill(victim, signal.SIGKILL)
        m = _wait_for_text(log, rf"\[actor\] actor 0 \(pid {victim} on {HOST}; log {re.escape(str(out / 'logs'))}/"
                                rf"actor-0\.log\) died \((process gone: .+)\); its successor starts in the background "
                                r"and training goes on with the other 1 actor\(s\); its shard resumes past the \d+ "
                                r"prompts trained, discarded or buffered\n", proc, 300)
        joined = _wait_for_text(log, r"\[actor\] actor 0 restarted as pid (\d+) and joined at version (\d+) in \d+s "
                                     r"\(training went on meanwhile\)\n", proc, 300)
        version = int(joined.group(2))
        # the dead actor's engine processes are reaped, not left running beside the new engine
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(p) for p in engine):
            time.sleep(0.5)
        assert not any(alive(p) for p in engine), f"engine processes of the dead actor left behind: {engine}"

        wait_for_trained_rows(out, version + 4, proc, log)
        roles = json.loads((out / "processes.json").read_text())
        assert roles["actor/0"]["pid"] != victim and roles["actor/1"]["pid"] == pids[1]  # rewritten on restart
        buffer_pid = roles["buffer"]["pid"]
        os.kill(buffer_pid, signal.SIGKILL)
        b = _wait_for_text(log, rf"\[buffer\] the buffer process \(pid {buffer_pid} on {HOST}; log "
                                rf"{re.escape(str(out / 'logs'))}/buffer\.log\) died \(exit code -9\); restarted as "
                                r"pid (\d+) in \d+s: (\d+) groups restored from \S+ \(\d+ trained since then left "
                                r"out\); \d+ prompts it had lost re-queued\n", proc, 120)
        assert int(b.group(1)) != buffer_pid
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            if sid is not None:
                os.killpg(sid, signal.SIGKILL)
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text[-5000:]
    assert "[done]" in text
    # each kill is the one line awaited above, and the console carries nothing but our own lines
    said = [line for line in text.splitlines() if f"pid {victim} " in line or f"pid {buffer_pid} " in line]
    assert said == [m.group(0).strip(), b.group(0).strip()], said
    assert_quiet_console(text)
    assert "A worker died or was killed" in (out / "logs" / "ray.log").read_text()  # Ray's account: in the logs
    headers = [line for line in (out / "logs" / "actor-0.log").read_text().splitlines() if line.startswith("--- ")]
    assert [h.split(",")[0] for h in headers] == [f"--- actor-0: pid {victim} on {socket.gethostname()}",
                                                  f"--- actor-0: pid {joined.group(1)} on {socket.gethostname()}"]
    assert (out / "logs" / "buffer.log").is_file()

    train_rows = check_run(out, STEPS, K, "loss/pg")  # every step, none above the staleness bound
    assert_keys_documented(out)
    assert_weights_changed(out, STEPS, model_cache)
    assert train_rows[-1]["actors/restarts"] >= 1 and train_rows[-1]["buffer/restarts"] == 1
    restart_step = next(r["step"] for r in train_rows if r["actors/restarts"] >= 1)
    assert restart_step <= version  # counted at the death; it joined later, at the version then current

    state = ledger_state(out, STEPS)
    keys = list(zip(state["epochs"], state["prompts"]))
    assert len(keys) == STEPS * 4 and len(set(keys)) == len(keys), "a prompt was trained twice"
    # A group trained at step s was generated at version >= s - 1 - K; the dead actor never held a
    # version above restart_step, so actor 0's prompts (even indices: the shard of actor 0 of 2)
    # trained from step restart_step + K + 2 on were generated by the restarted actor.
    late = [i for i, s in zip(state["prompts"], state["steps"]) if s + 1 >= restart_step + K + 2]
    assert late, f"no step after {restart_step + K + 1} (restart at {restart_step}): raise STEPS"
    assert any(i % 2 == 0 for i in late), f"the restarted actor 0 generated nothing: prompts {late}"
