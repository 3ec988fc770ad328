"""bench/chaos's two later fault kinds, without a run: `join` (issue 42 item 5, review gpu_path_3 F1: a successor's
engine core held in the weight-sync join) injected into stand-in processes, and `env` (issue 39 item 5: an
environment that raises or hangs on a share of calls) through the episode's own call wrapper; their parsing, the
run's overrides and the report's counts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from bench.chaos.chaos import arguments, overrides
from bench.chaos.chaos_env import HANG_SHARE, RAISE_SHARE, ChaosEnvError, FlakyStep, call_fate
from bench.chaos.chaos_monkey import FaultPlan, Monkey
from bench.chaos.chaos_procs import (
    engine_cores,
    joined_lines,
    kv_lines,
    open_fds,
    read_proc,
    read_procs,
    state_becomes,
)
from bench.chaos.chaos_report import _note, env_counts, load_faults, unexplained_actor_restarts
from envs.episode import EnvFault, call_with_timeout


# ---------------------------------------------------------------------------------------------- parsing
def test_the_new_kinds_parse_and_the_env_kind_makes_the_run_multi_turn(tmp_path, capsys):
    args = arguments(["--faults", "env,join", "--env-timeout-s", "4", "--out-dir", str(tmp_path / "o")])
    assert args.faults == ["join", "env"] and args.join_stall_s == 45.0
    sets = overrides(args)
    assert sets[:5] == ["learner.steps=350", "max_restarts=40", "learner.save_every=10", "rollout.num_actors=2",
                        "learner.world_size=1"]
    assert sets[5].startswith("env.environment=") and sets[5].endswith("bench/chaos/chaos_env.py:FlakyStep")
    assert sets[6:] == ["env.max_turns=2", "env.call_timeout_s=4"]
    assert not any(s.startswith("env.") for s in overrides(arguments(["--faults", "join", "--out-dir",
                                                                      str(tmp_path / "o")])))
    with pytest.raises(SystemExit):
        arguments(["--faults", "join", "--join-stall-s", "0", "--out-dir", str(tmp_path / "o")])
    assert "--join-stall-s 0.0: must be positive" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- env
def test_the_env_fault_shares_are_about_ten_and_five_percent_and_deterministic():
    fates = [call_fate(p, 1, f"answer {p % 7}") for p in range(20000)]
    # 20000 draws: the standard error of a 10 % share is sqrt(0.1 * 0.9 / 20000) = 0.21 %, of 5 % 0.15 %
    assert abs(fates.count("raise") / 20000 - RAISE_SHARE) < 0.01
    assert abs(fates.count("hang") / 20000 - HANG_SHARE) < 0.008
    assert fates == [call_fate(p, 1, f"answer {p % 7}") for p in range(20000)]


def first_with(fate: str) -> int:
    return next(p for p in range(1000) if call_fate(p, 1, "\\boxed{4}") == fate)


@pytest.mark.parametrize("fate, reason", [("raise", "errors"), ("hang", "timeouts")])
def test_a_failing_env_call_ends_the_trajectory_with_its_counted_reason(fate, reason):
    env = FlakyStep()
    env.reset({"ground_truth": "4", "prompt_index": first_with(fate)})

    async def call():
        with pytest.raises(EnvFault) as e:
            await call_with_timeout(env.step, "\\boxed{4}", timeout_s=0.2)
        return e.value

    t = time.monotonic()
    assert asyncio.run(call()).reason == reason
    assert time.monotonic() - t < 5  # a hang is cut at the timeout, not slept out
    if fate == "raise":  # the environment's own error, which the episode counts in env/errors
        env.reset({"ground_truth": "4", "prompt_index": first_with(fate)})
        with pytest.raises(ChaosEnvError):
            asyncio.run(env.step("\\boxed{4}"))


def test_an_answering_env_call_scores_the_first_turn_and_ends_at_the_second():
    env = FlakyStep()
    env.reset({"ground_truth": "4", "prompt_index": first_with("ok")})
    assert asyncio.run(env.step("\\boxed{4}")) == ("ok", 0.0, False)
    assert asyncio.run(env.step("anything")) == ("", 1.0, True)


def test_the_env_counts_are_the_last_rows_cumulative_counts(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 1}, {"step": 2, "env/trajectories": 10, "env/errors": 2, "env/timeouts": 1},
            {"step": 3, "env/trajectories": 30, "env/errors": 3, "env/timeouts": 1}, {"step": 4}]
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"step\"")
    # cumulative counts (docs/metrics.md): the last row that has them; a half-written last line is skipped
    assert env_counts(metrics) == {"env/trajectories": 30, "env/errors": 3, "env/timeouts": 1}


# ---------------------------------------------------------------------------------------------- join
DRIVER = "import time; time.sleep(60)"
# the stand-in engine core opens a file descriptor (as the join's store connection does) once "join" exists
CORE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.01)\nf = open(sys.argv[1])\ntime.sleep(60)"
SUCCESSOR = "exec -a ray::ActorRole.__init__ bash -c '(exec -a VLLM::EngineCore {py} -c \"$0\" {join}) & wait' {core}"


def test_the_join_faults_readings():
    console = "\n".join(["[actor] actor 1 (pid 5 on h; log l) died (x); its successor starts in the background",
                         "[actor] actor 1 restarted as pid 6 and joined at version 3 in 20s (training went on meanwhile)",
                         "[actor] actor 10 restarted as pid 8 and joined at version 4 in 20s"])
    assert (joined_lines(console, 1), joined_lines(console, 10), joined_lines(console, 0)) == (1, 1, 0)
    with open(os.devnull):
        assert open_fds(os.getpid()) > 0 and open_fds(2 ** 22 + 1) is None
        n = open_fds(os.getpid())
    assert open_fds(os.getpid()) == n - 1


@pytest.mark.parametrize("late", [False, True])
def test_a_join_fault_kills_an_actor_and_holds_its_successors_engine_once_built(tmp_path, late):
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = run_dir / "logs" / "actor-0.log"
    log.write_text("[engine] KV cache: 9 tokens\n")  # the victim's own engine, built long ago
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, "-m", "launch.commands.supervisor", "spec", str(run_dir)])
    victim = subprocess.Popen(["sleep", "60"])
    (run_dir / "processes.json").write_text(json.dumps({"driver": {"pid": os.getpid()}, "actor/0": {"pid": victim.pid}}))
    (tmp_path / "run.log").write_text("12:00:00 step 4/40 | 9.0 samples/s\n")
    m = Monkey(run_dir, tmp_path / "run.log", FaultPlan(every_s=20, seed=3, kinds=frozenset({"join"}),
                                                        join_stall_s=30), tmp_path / "kills.jsonl")
    hunt = threading.Thread(target=lambda: setattr(m, "fired", m._join(seen=5)))
    hunt.start()
    successor = None
    try:
        assert victim.wait(timeout=10) == -signal.SIGKILL
        join = tmp_path / "join"
        successor = subprocess.Popen(["bash", "-c", SUCCESSOR.format(py=sys.executable, join=join, core=shlex.quote(CORE))])
        deadline = time.monotonic() + 10
        while not (cores := engine_cores(read_procs(), successor.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert hunt.is_alive() and read_proc(cores[0].pid).state != "T"  # its engine not built yet: not held
        if late:  # the rebuild won the race: the successor joined before the bench saw its engine built
            with open(tmp_path / "run.log", "a") as f:
                f.write("[actor] actor 0 restarted as pid 9 and joined at version 3 in 20s\n")
        with open(log, "a") as f:
            f.write("[engine] KV cache: 9 tokens\n")
        assert kv_lines([log]) == 2
        time.sleep(0.3)
        assert hunt.is_alive() and read_proc(cores[0].pid).state != "T"  # built, not joining yet: not held
        join.write_text("")  # the core enters the join: it opens a descriptor
        hunt.join(timeout=60)  # under load the hold takes seconds to be seen
        [fault] = load_faults(tmp_path / "kills.jsonl")
        if late:
            assert m.fired and fault["held"]["late"] and fault["cont"]["sent"]
            assert state_becomes(cores[0].pid, "not T") and _note(fault).startswith("too late")
            return
        assert m.fired and state_becomes(cores[0].pid, "T")
        m._cont()
        assert read_proc(cores[0].pid).state == "T"  # not due for 30 s
        m._cont(everything=True)
        assert state_becomes(cores[0].pid, "not T")
        [fault] = load_faults(tmp_path / "kills.jsonl")
        assert (fault["kind"], fault["role"], fault["name"], fault["pid"], fault["stall_s"]) == (
            "join", "actor", "actor/0", victim.pid, 30)
        assert (fault["held"]["pid"], fault["held"]["actor_pid"], fault["cont"]["sent"]) == (
            cores[0].pid, successor.pid, True)
        assert _note(fault).startswith(f"successor engine core pid {cores[0].pid} SIGSTOPped")
    finally:
        m.done.set()
        hunt.join(timeout=10)
        for p in [*(engine_cores(read_procs(), successor.pid) if successor else []), successor, driver, victim]:
            if p is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in (successor, driver, victim):
            if p is not None:
                p.wait()


def test_a_join_fault_whose_successor_never_comes_up_is_recorded_as_missed(tmp_path):
    faults = tmp_path / "kills.jsonl"
    faults.write_text(json.dumps({"kind": "join", "role": "actor", "name": "actor/1", "pid": 7, "stall_s": 45}) + "\n"
                      + json.dumps({"kind": "held", "of": 0, "missed": True, "epoch": 1.0}) + "\n")
    [fault] = load_faults(faults)
    assert _note(fault) == "missed: no successor engine came up to hold in the join"


def test_live_engines_replaced_are_the_restarts_no_fault_hit():
    faults = [{"kind": "join", "role": "actor", "pid": 10, "held": {"pid": 12, "actor_pid": 11}},
              {"kind": "stuck", "role": "actor", "pid": 20, "actor_pid": 21},
              {"kind": "kill", "role": "buffer", "pid": 30}]
    # 10: SIGKILLed; 11: the held successor, blamed; 21: the stuck core's actor; 40: a live engine replaced
    assert unexplained_actor_restarts([10, 11, 21, 40], faults) == [40]
    assert unexplained_actor_restarts([10], faults) == []
