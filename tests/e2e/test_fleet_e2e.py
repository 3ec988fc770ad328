"""End to end: one live run's fleet changes under it, as an operator's bad day and good day would change it, and
every prompt is still trained once. A real RLOO run (vLLM actors under Ray, the untrained tiny model; this is also
the suite's asynchronous RLOO run) trains with 2 actors, then:

1. actor 0's process is SIGKILLed (as the OOM killer would): its successor starts in the background while the other
   actor's groups are trained, joins at the current weights, and its unfinished prompts are generated again; no
   engine process of the dead actor is left behind;
2. the buffer process (found in the run's processes.json) is SIGKILLed: the driver restarts it from its latest
   snapshot (taken every 2 s here), the actors reconnect, and `buffer/restarts` counts it;
3. `algo-train scale RUN --actors 3` starts actor 2 while the learner trains on (the console says when it joined and
   at which version, V3); later `algo-train scale RUN --actors 2` makes it leave after delivering what it had in
   flight;
4. the run is stopped with SIGINT (the graceful path: drain, checkpoint; exit 130).

What must hold:
- the console says one line of ours for each kill (naming the process: pid, host, log file, and what the run did)
  and for each change of scale, and nothing else: no Ray lines (they are in run_dir/logs/ray.log), no buffer warnings
  (run_dir/logs/buffer.log), no separate line for the weight push the dead actor failed;
- no row above the staleness bound is trained, every step trains a full batch, and the final checkpoint's ledger
  lists no prompt twice;
- the restarted actor generated: a group trained at step s was generated at a version >= s - 1 - K, and the dead
  actor never held a version above the step its death was counted at, so actor 0's prompts (even indices: shard i::2)
  trained later, before the scale-up, came from its successor;
- the added actor generated: after the scale-up every prompt i with i % 3 == 2 is actor 2's (shards i::3), so such
  prompts trained at steps V3 + K + 1 ... (the step the scale-down was asked at) came from actor 2;
- processes.json lists 2 actors again at the end.
(The learner rank's kill: tests/launch/test_fault_console.py.)
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
    EXE,
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
    trained_rows,
    wait_for_trained_rows,
)

pytestmark = pytest.mark.slow

KILL_AFTER = 2  # trained steps before the actor's kill
K = 1  # max_staleness
BATCH = 4  # learner.batch_prompts (SMALL)
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


def _scale(out, actors: int) -> str:
    """`algo-train scale` as a user types it; its one line."""
    done = subprocess.run([EXE, "scale", str(out), "--actors", str(actors)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_killed_actor_and_buffer_come_back_then_the_fleet_grows_and_shrinks(tmp_path, model_cache):
    out, log = tmp_path / "fleet", tmp_path / "fleet.log"
    logs = re.escape(str(out / "logs"))
    # room for a third actor on this 2-core machine (1 CPU for the learner; the planner would give 2 actors
    # 0.5 CPU each, and a scale-up Ray cannot place is cancelled: the first try of the scale test showed it)
    cmd = command(out, model_cache, "--algo", "rloo", "--actors", "2", "--steps", "2000", "--max-staleness", str(K),
                  "--set", "rollout.cpus_per_actor=0.3", "--set", "buffer.snapshot_every_s=2", *UNTRAINED)
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

        # 1. an actor dies
        wait_for_trained_rows(out, KILL_AFTER, proc, log)
        os.kill(victim, signal.SIGKILL)
        died = _wait_for_text(log, rf"\[actor\] actor 0 \(pid {victim} on {HOST}; log {logs}/actor-0\.log\) died "
                                   r"\((process gone: .+)\); its successor starts in the background and training goes "
                                   r"on with the other 1 actor\(s\); its shard resumes past the \d+ prompts trained, "
                                   r"discarded or buffered\n", proc, 300)
        joined = _wait_for_text(log, r"\[actor\] actor 0 restarted as pid (\d+) and joined at version (\d+) in \d+s "
                                     r"\(training went on meanwhile\)\n", proc, 300)
        version = int(joined.group(2))
        deadline = time.monotonic() + 30  # the dead actor's engine processes are reaped, not left running
        while time.monotonic() < deadline and any(alive(p) for p in engine):
            time.sleep(0.5)
        assert not any(alive(p) for p in engine), f"engine processes of the dead actor left behind: {engine}"

        # 2. the buffer dies
        wait_for_trained_rows(out, version + 4, proc, log)
        roles = json.loads((out / "processes.json").read_text())
        assert roles["actor/0"]["pid"] != victim and roles["actor/1"]["pid"] == pids[1]  # rewritten on restart
        buffer_pid = roles["buffer"]["pid"]
        os.kill(buffer_pid, signal.SIGKILL)
        restored = _wait_for_text(log, rf"\[buffer\] the buffer process \(pid {buffer_pid} on {HOST}; log {logs}/"
                                       r"buffer\.log\) died \(exit code -9\); restarted as pid (\d+) in \d+s: (\d+) "
                                       r"groups restored from \S+ \(\d+ trained since then left out\); \d+ prompts it "
                                       r"had lost re-queued\n", proc, 120)
        assert int(restored.group(1)) != buffer_pid

        # 3. the operator scales up, then down
        wait_for_trained_rows(out, len(trained_rows(out)) + 2, proc, log)
        asked_up = len(trained_rows(out))
        assert _scale(out, 3).startswith(f"[scale] asked the run at {out} for 3 actors (it lists 2)")
        _wait_for_text(log, r"\[scale\] asked for 3 actors: actors 2 start in the background and training goes on "
                            r"with 2\n", proc, 120)
        up = _wait_for_text(log, r"\[scale\] actors 2 joined \(pids (\d+)\) at version (\d+) in \d+s: the run has 3 "
                                 r"actors, each on shard i::3\n", proc, 300)
        v3 = int(up.group(2))
        assert json.loads((out / "processes.json").read_text())["actor/2"]["pid"] == int(up.group(1))
        wait_for_trained_rows(out, v3 + K + 8, proc, log)
        asked_down = len(trained_rows(out))
        _scale(out, 2)
        _wait_for_text(log, r"\[scale\] asked for 2 actors: actors 2 left after delivering what they had in flight, "
                            r"in \d+s; the run has 2 actors, each on shard i::2\n", proc, 120)

        # 4. Ctrl-C
        wait_for_trained_rows(out, len(trained_rows(out)) + 3, proc, log)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            if sid is not None:
                os.killpg(sid, signal.SIGKILL)
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 130, text[-5000:]
    # each kill and each change of scale is the one line awaited above; the console carries only our own lines
    said = [line for line in text.splitlines() if f"pid {victim} " in line or f"pid {buffer_pid} " in line]
    assert said == [died.group(0).strip(), restored.group(0).strip()], said
    assert [line for line in text.splitlines() if line.startswith("[scale]")] == [
        "[scale] asked for 3 actors: actors 2 start in the background and training goes on with 2",
        up.group(0).strip(), re.search(r"\[scale\] asked for 2 actors: .*", text).group(0)]
    assert_quiet_console(text)
    assert "A worker died or was killed" in (out / "logs" / "ray.log").read_text()  # Ray's account: in the logs
    headers = [line for line in (out / "logs" / "actor-0.log").read_text().splitlines() if line.startswith("--- ")]
    assert [h.split(",")[0] for h in headers] == [f"--- actor-0: pid {victim} on {socket.gethostname()}",
                                                  f"--- actor-0: pid {joined.group(1)} on {socket.gethostname()}"]
    assert (out / "logs" / "buffer.log").is_file()
    roles = json.loads((out / "processes.json").read_text())
    assert sorted(r for r in roles if r.startswith("actor/")) == ["actor/0", "actor/1"]

    steps = len(trained_rows(out))
    train_rows = check_run(out, steps, K, "loss/pg")  # every step, none above the staleness bound
    assert_keys_documented(out)
    assert_weights_changed(out, steps, model_cache)
    assert train_rows[-1]["actors/restarts"] >= 1 and train_rows[-1]["buffer/restarts"] == 1
    restart_step = next(r["step"] for r in train_rows if r["actors/restarts"] >= 1)
    assert restart_step <= version  # counted at the death; it joined later, at the version then current

    state = ledger_state(out, steps)
    keys = list(zip(state["epochs"], state["prompts"]))
    assert len(keys) == steps * BATCH and len(set(keys)) == len(keys), "a prompt was trained twice"
    trained = list(zip(state["prompts"], state["steps"]))
    by_successor = [i for i, s in trained if restart_step + K + 2 <= s + 1 <= asked_up and i % 2 == 0]
    assert by_successor, f"the restarted actor 0 generated nothing trained between {restart_step + K + 2} and {asked_up}"
    by_actor_2 = [i for i, s in trained if v3 + K + 1 <= s + 1 <= asked_down and i % 3 == 2]
    assert by_actor_2, f"actor 2 generated nothing trained between steps {v3 + K + 1} and {asked_down}"
