"""End to end: a live run is scaled from 2 actors to 3 and back to 2 with `algo-train scale`, as an operator
would, and every prompt is still trained once.

A real RLOO run (vLLM actors under Ray, the untrained tiny model) trains; `algo-train scale RUN --actors 3`
starts actor 2 while the learner trains on (the console says when it joined and at which version, V3);
later `algo-train scale RUN --actors 2` makes it leave after delivering what it had in flight. Then the
run is stopped with SIGINT (the graceful path: drain, checkpoint; exit 130). What must hold:
- each change is one line of ours, and the console carries nothing else of it;
- the added actor generated: after the scale-up every prompt i with i % 3 == 2 is actor 2's (shards i::3),
  and a group trained at step s was generated at a version >= s - 1 - K, so such prompts trained at steps
  V3 + K + 1 ... (the step the scale-down was asked at) came from actor 2;
- the final checkpoint's ledger lists no prompt twice, and every step trained a full batch;
- processes.json lists 2 actors again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from tests.e2e.helpers import (
    EXE,
    UNTRAINED,
    assert_quiet_console,
    command,
    ledger_state,
    run_session,
    trained_rows,
    wait_for_trained_rows,
)
from tests.e2e.test_actor_restart_e2e import _wait_for_text

pytestmark = pytest.mark.slow

K = 1  # max_staleness
BATCH = 4  # learner.batch_prompts (SMALL)


def _scale(out, actors: int) -> str:
    """`algo-train scale` as a user types it; its one line."""
    done = subprocess.run([EXE, "scale", str(out), "--actors", str(actors)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_a_live_run_grows_and_shrinks_and_trains_every_prompt_once(tmp_path, model_cache):
    out, log = tmp_path / "scaled", tmp_path / "scaled.log"
    # room for a third actor on this 2-core machine (1 CPU for the learner; the planner would give 2 actors
    # 0.5 CPU each, and a scale-up Ray cannot place is cancelled: the first try of this test showed it)
    cmd = command(out, model_cache, "--algo", "rloo", "--actors", "2", "--steps", "2000",
                  "--max-staleness", str(K), "--set", "rollout.cpus_per_actor=0.3", *UNTRAINED)
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, RAY_DEDUP_LOGS="1"))
    sid = None
    try:
        sid = run_session(proc.pid)
        wait_for_trained_rows(out, 3, proc, log, timeout_s=600)
        assert _scale(out, 3).startswith(f"[scale] asked the run at {out} for 3 actors (it lists 2)")
        _wait_for_text(log, r"\[scale\] asked for 3 actors: actors 2 start in the background and training goes on "
                            r"with 2\n", proc, 120)
        joined = _wait_for_text(log, r"\[scale\] actors 2 joined \(pids (\d+)\) at version (\d+) in \d+s: the run "
                                     r"has 3 actors, each on shard i::3\n", proc, 300)
        v3 = int(joined.group(2))
        assert json.loads((out / "processes.json").read_text())["actor/2"]["pid"] == int(joined.group(1))

        wait_for_trained_rows(out, v3 + K + 8, proc, log)
        asked_down = len(trained_rows(out))
        _scale(out, 2)
        _wait_for_text(log, r"\[scale\] asked for 2 actors: actors 2 left after delivering what they had in flight, "
                            r"in \d+s; the run has 2 actors, each on shard i::2\n", proc, 120)
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
    assert_quiet_console(text)
    assert [line for line in text.splitlines() if line.startswith("[scale]")] == [
        "[scale] asked for 3 actors: actors 2 start in the background and training goes on with 2",
        re.search(r"\[scale\] actors 2 joined .*", text).group(0),
        re.search(r"\[scale\] asked for 2 actors: .*", text).group(0)]
    roles = json.loads((out / "processes.json").read_text())
    assert sorted(r for r in roles if r.startswith("actor/")) == ["actor/0", "actor/1"]

    steps = len(trained_rows(out))
    state = ledger_state(out, steps)
    keys = list(zip(state["epochs"], state["prompts"]))
    assert len(keys) == steps * BATCH and len(set(keys)) == len(keys), "a prompt was trained twice"
    by_actor_2 = [i for i, s in zip(state["prompts"], state["steps"])
                  if v3 + K + 1 <= s + 1 <= asked_down and i % 3 == 2]
    assert by_actor_2, f"actor 2 generated nothing trained between steps {v3 + K + 1} and {asked_down}"
