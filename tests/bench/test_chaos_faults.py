"""bench/chaos/chaos.py's fault kinds and per-fault table (issue 33 item 5), without a run: the console parsers (step
times, restart lines old and new), the /proc reading that finds the victims, the snapshot window, the faults
injected into stand-in processes, and the idle arithmetic of the table on hand-made timelines."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.chaos.chaos import arguments, overrides
from bench.chaos.chaos_console import Restart, progress, restart_events, restarts, step_times
from bench.chaos.chaos_monkey import ROLES, FaultPlan, Monkey
from bench.chaos.chaos_procs import (
    alive_in,
    descendants,
    engine_cores,
    find_driver,
    read_proc,
    read_procs,
    run_roles,
    snapshot_window,
    state_becomes,
)
from bench.chaos.chaos_report import fault_rows, fault_table, idle_around, load_faults, typical_gap


# ---------------------------------------------------------------------------------------------- the console
def test_progress_lines_are_placed_on_the_calendar_across_midnight():
    start = time.mktime((2026, 11, 26, 23, 59, 50, 0, 0, -1))  # local time, as the run's progress lines
    console = "\n".join([
        "[run] grpo: 2 actor(s)",
        "23:59:55 step 1/3 | 9.0 samples/s | reward 0.10 | eval - | stale 0.0/0 | ETA ?",
        "[actor] actor 0 (pid 5 on h; log l) died (x); its successor starts in the background",
        "00:00:05 step 2/3 | 9.0 samples/s | reward 0.10 | eval - | stale 0.0/0 | ETA ?",
        "00:00:09 step 3/3 | 9.0 samples/s | reward 0.10 | eval - | stale 0.0/0 | ETA 0m00s",
    ])
    # 23:59:55 is 5 s after the start; 00:00:05 is on the next day: 10 s to midnight + 5 = 15 s; then 19 s
    assert step_times(console, start) == [start + 5, start + 15, start + 19]
    assert progress(console) == (3, 3, 3)
    assert progress(console.rsplit("\n", 1)[0]) == (2, 2, 3)
    assert progress("[run] starting") == (0, 0, 0)


def test_restart_lines_old_and_new_forms():
    console = "\n".join([
        # before issue 33: one line per actor restart
        "[actor] actor 0 (pid 10557 on node1; log runs/a/logs/actor-0.log) died (process gone: ActorDiedError); "
        "restarted as pid 12062 and re-synced to version 2 in 51s; its shard resumes past the 40 prompts trained",
        # restarts in the background: the death, then the successor's line once it is up
        "[actor] actor 1 (pid 200 on node1; log l) died (process gone); its successor starts in the background and "
        "training goes on with the other 1 actor(s); its shard resumes past the 90 prompts trained",
        "12:00:01 step 3/60 | 10.0 samples/s",
        "[actor] actor 1 restarted as pid 201 and joined at version 7 in 14s (training went on meanwhile)",
        # a successor killed before it was up: one successor answers both deaths, its time the last one's
        "[actor] actor 0 (pid 300 on node1; log l) died (x); its successor starts in the background",
        "[actor] actor 0 (pid 301 on node1; log l) died (y); its successor starts in the background",
        "[actor] actor 0 joined at version 9, 22s after its death",
        "[buffer] the buffer process (pid 4242 on node1; log runs/x/logs/buffer.log) died (exit code -9); restarted "
        "as pid 4311 in 1s: 6 groups restored from runs/x/buffer/snapshot.msgpack",
        "[learner] learner rank 1 (pid 777 on node1; log runs/a/logs/learner-1.log) died (process gone: "
        "ActorDiedError); restart 1 of 5: resuming runs/a from step 30",
        "[learner] restart 2 of 5: resuming runs/a from step 40",
        "[scale] actors 2 joined (pids 9) at version 3 in 40s: the run has 3 actors",  # not a restart
        "[actor] actor 1 (pid 99 on node1; log l) died (x); the run stopped",  # never answered: no restart
    ])
    assert restart_events(console) == [
        Restart("actor", 10557, 51.0), Restart("actor", 200, 14.0), Restart("actor", 300, None),
        Restart("actor", 301, 22.0), Restart("buffer", 4242, 1.0), Restart("learner", 777, None),
        Restart("learner", 0, None)]
    assert restarts(console) == {"actor": [10557, 200, 300, 301], "buffer": [4242], "learner": [777, 0]}


# ---------------------------------------------------------------------------------------------- /proc
def fake_proc(root: Path, pid: int, ppid: int, session: int, cmdline: str, state: str = "S", start: int = 1000):
    """A /proc/PID entry as Linux writes it: stat (comm in parentheses, may hold spaces and ')'), cmdline
    NUL-separated."""
    d = root / str(pid)
    d.mkdir()
    fields = [state, ppid, session, session, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 20, 0, 1, 0, start, 0, 0]
    (d / "stat").write_text(f"{pid} (a (b) c) " + " ".join(map(str, fields)) + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline.split(" ")) + b"\0")


@pytest.fixture
def proc_root(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    fake_proc(root, 100, 1, 100, "/venv/bin/python -m launch.commands.supervisor /runs/a/.run_config.json /runs/a",
              start=500)
    fake_proc(root, 90, 1, 90, "/venv/bin/python -m launch.commands.supervisor /runs/b/.run_config.json /runs/b")
    fake_proc(root, 101, 100, 100, "/venv/lib/ray/core/src/ray/raylet/raylet --node_ip_address=127.0.0.1")
    fake_proc(root, 110, 100, 100, "/venv/bin/python -c from multiprocessing.spawn import spawn_main; "
                                   "spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork")
    fake_proc(root, 111, 100, 100, "/venv/bin/python -c from multiprocessing.resource_tracker import main;main(4)")
    fake_proc(root, 200, 101, 100, "ray::ActorRole.start")
    fake_proc(root, 201, 200, 100, "VLLM::EngineCore", start=2000)
    fake_proc(root, 210, 101, 100, "ray::ActorRole")
    fake_proc(root, 212, 210, 100, "ray::ActorRole")  # its engine core before it set its own title
    fake_proc(root, 211, 210, 100, "VLLM::EngineCore", state="Z")  # a dead engine core not yet reaped
    fake_proc(root, 300, 101, 100, "ray::LearnerRank.step")
    fake_proc(root, 400, 1, 999, "ray::ActorRole")  # another run's actor
    return root


def test_the_runs_roles_are_found_by_title_in_its_session(proc_root):
    procs = read_procs(proc_root)
    assert (procs[201].ppid, procs[201].session, procs[201].start, procs[201].cmdline) == (200, 100, 2000,
                                                                                          "VLLM::EngineCore")
    driver = find_driver(procs, Path("/runs/a"))
    assert driver.pid == 100
    assert run_roles(procs, driver.pid) == {"actor": [200, 210], "learner": [300], "buffer": [110]}
    assert [p.pid for p in engine_cores(procs, 200)] == [201]
    assert engine_cores(procs, 210) == []  # its core is a zombie
    assert alive_in(200, 100, proc_root) and not alive_in(400, 100, proc_root) and not alive_in(211, 100, proc_root)
    assert not alive_in(12345, 100, proc_root)  # gone


def test_this_process_reads_back_from_the_real_proc():
    me = read_proc(os.getpid())
    assert (me.ppid, me.session, me.state) == (os.getppid(), os.getsid(0), "R")


def test_the_snapshot_window_is_the_staged_checkpoint_between_the_learners_part_and_the_snapshot(tmp_path):
    ckpts = tmp_path / "checkpoints"
    assert snapshot_window(ckpts) is None  # no folder yet
    (ckpts / "step_10").mkdir(parents=True)
    (ckpts / "step_10" / "learner_state.json").write_text("{}")  # committed: no window
    staged = ckpts / ".step_20.tmp"
    staged.mkdir()
    (staged / "model.pt").write_text("")
    assert snapshot_window(ckpts) is None  # the learner ranks still writing
    (staged / "learner_state.json").write_text("{}")
    assert snapshot_window(ckpts) == (staged, ".step_20.tmp: the learner's part written, the buffer's snapshot not yet")
    (staged / ".buffer-snapshot-ab12").write_bytes(b"x")
    assert snapshot_window(ckpts) == (staged, ".step_20.tmp: the buffer's temp file .buffer-snapshot-ab12 written")
    # a save a kill interrupted leaves both behind: files written before the bench began looking do not count
    later = time.time() + 60
    assert snapshot_window(ckpts, since=later) is None
    os.utime(staged / "learner_state.json", (later, later))
    assert snapshot_window(ckpts, since=later)[1] == ".step_20.tmp: the learner's part written, the buffer's snapshot not yet"
    (staged / ".buffer-snapshot-ab12").rename(staged / "buffer.msgpack")
    assert snapshot_window(ckpts) is None  # written: the checkpoint is about to be committed


# ---------------------------------------------------------------------------------------------- the faults
@pytest.fixture
def stand_ins(tmp_path):
    """A run folder whose processes.json names this process as the driver and stand-in processes (in this
    session) as the roles; actor/0 has an engine-core child titled as vLLM titles it."""
    procs = {name: subprocess.Popen(["sleep", "60"]) for name in ("actor/1", "buffer", "learner/0", "learner/1")}
    procs["actor/0"] = subprocess.Popen(["bash", "-c", "(exec -a VLLM::EngineCore sleep 60) & wait"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    roles = {"driver": {"pid": os.getpid(), "host": "h"}} | {n: {"pid": p.pid, "host": "h"} for n, p in procs.items()}
    (run_dir / "processes.json").write_text(json.dumps(roles))
    deadline = time.monotonic() + 10
    while not (cores := engine_cores(read_procs(), procs["actor/0"].pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield run_dir, procs
    for core in cores:  # outlives its stand-in actor when a test kills that
        with contextlib.suppress(ProcessLookupError):
            os.kill(core.pid, signal.SIGKILL)
    for p in procs.values():
        p.kill()
        p.wait()


def monkey_for(run_dir: Path, **plan) -> Monkey:
    return Monkey(run_dir, run_dir.parent / "run.log", FaultPlan(every_s=20, seed=3, **plan),
                  run_dir.parent / "kills.jsonl")


def test_a_periodic_kill_draws_its_victim_as_the_bench_always_did(stand_ins):
    run_dir, procs = stand_ins
    m = monkey_for(run_dir)
    m._gap()  # the loop draws the first gap before the first kill
    old = random.Random(3)  # the bench before issue 33: gap, then role, then which one of it
    old.uniform(0.5, 1.5)
    role = old.choice(ROLES)
    name = old.choice(sorted(n for n in procs if n.split("/")[0] == role))
    assert m._kill(seen=7)
    assert procs[name].wait(timeout=10) == -signal.SIGKILL
    [fault] = load_faults(run_dir.parent / "kills.jsonl")
    assert (fault["kind"], fault["role"], fault["name"], fault["pid"], fault["steps_seen"]) == (
        "kill", role, name, procs[name].pid, 7)


def test_training_seconds_wait_while_an_actor_restarts(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    m = monkey_for(run_dir)
    listed = {"driver": {"pid": 1}, "buffer": {"pid": 2}, "learner/0": {"pid": 3}}
    for actors, whole in [(2, True), (1, False), (2, True)]:  # actor/1 died, then its successor joined
        (run_dir / "processes.json").write_text(json.dumps(listed | {f"actor/{i}": {"pid": 9 + i} for i in range(actors)}))
        assert m.all_actors() is whole


def test_a_stuck_engine_core_is_stopped_then_continued(stand_ins):
    run_dir, procs = stand_ins
    m = monkey_for(run_dir, kinds=frozenset({"stuck"}), stuck_s=30)
    # a draw of actor/1, which has no engine core, is no fault: the bench tries again the next second
    assert any(m._stick(seen=4) for _ in range(50))
    [core] = engine_cores(read_procs(), procs["actor/0"].pid)
    assert state_becomes(core.pid, "T")  # stopped (once the kernel next schedules it)
    m._cont()
    assert read_proc(core.pid).state == "T"  # not due for 30 s
    m._cont(everything=True)
    assert state_becomes(core.pid, "not T")
    [fault] = load_faults(run_dir.parent / "kills.jsonl")
    assert (fault["kind"], fault["name"], fault["pid"], fault["actor_pid"], fault["stuck_s"]) == (
        "stuck", "actor/0 engine core", core.pid, procs["actor/0"].pid, 30)
    assert fault["cont"]["sent"] is True


def test_the_buffer_is_killed_inside_the_snapshot_window(stand_ins):
    run_dir, procs = stand_ins
    staged = run_dir / "checkpoints" / ".step_30.tmp"
    staged.mkdir(parents=True)
    (staged / "learner_state.json").write_text("{}")  # left by an interrupted save: no window
    m = monkey_for(run_dir, kinds=frozenset({"snapshot"}))
    hunt = threading.Timer(0.0, lambda: setattr(m, "fired", m._snapshot(seen=30)))
    hunt.start()
    time.sleep(0.3)
    assert procs["buffer"].poll() is None
    (staged / "learner_state.json").write_text("{}")  # the save of step 30 again: the learner's part is written
    hunt.join(timeout=10)
    m.done.set()  # ends a hunt that never saw its window
    assert m.fired
    assert procs["buffer"].wait(timeout=10) == -signal.SIGKILL
    [fault] = load_faults(run_dir.parent / "kills.jsonl")
    assert (fault["kind"], fault["pid"], fault["landed"]) == ("snapshot", procs["buffer"].pid, True)
    assert fault["window"] == ".step_30.tmp: the learner's part written, the buffer's snapshot not yet"


DRIVER = ("import subprocess, sys, time; "  # a driver that has spawned its buffer, as multiprocessing titles it
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', 'spawn_main']); time.sleep(60)")


@pytest.mark.parametrize("seed, role", [(3, "buffer"), (4, "actor")])  # what random.Random(f"{seed}/once") draws
def test_a_start_up_fault_finds_its_victim_by_title_before_processes_json(tmp_path, seed, role):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, "-m", "launch.commands.supervisor", "spec", str(run_dir)])
    actor = subprocess.Popen(["bash", "-c", "exec -a ray::ActorRole.__init__ sleep 60"])
    m = Monkey(run_dir, tmp_path / "run.log", FaultPlan(every_s=20, seed=seed, kinds=frozenset({"startup"}),
                                                        startup_within_s=0.3), tmp_path / "kills.jsonl")
    give_up = threading.Timer(20, m.done.set)
    give_up.start()
    try:
        m._startup()
        [fault] = load_faults(tmp_path / "kills.jsonl")
        assert (fault["kind"], fault["role"], fault["phase"]) == ("startup", role, "roles starting (no processes.json yet)")
        if role == "actor":
            assert fault["pid"] == actor.pid and actor.wait(timeout=10) == -signal.SIGKILL
        else:
            assert read_proc(fault["pid"]).ppid == driver.pid
            deadline = time.monotonic() + 10
            while read_proc(fault["pid"]).state != "Z" and time.monotonic() < deadline:  # killed, not reaped
                time.sleep(0.05)
            assert read_proc(fault["pid"]).state == "Z"
    finally:
        give_up.cancel()
        for p in [*descendants(read_procs(), driver.pid), driver, actor]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        driver.wait()
        actor.wait()


def test_a_drain_fault_hits_a_role_after_the_last_step_or_is_missed(stand_ins):
    run_dir, procs = stand_ins
    (run_dir.parent / "run.log").write_text("12:00:00 step 39/40 | 9.0 samples/s\n12:00:01 step 40/40 | 9.0 samples/s\n")
    (run_dir / "checkpoints" / ".step_40.tmp").mkdir(parents=True)
    monkey_for(run_dir, kinds=frozenset({"drain"}))._drain()
    [fault] = load_faults(run_dir.parent / "kills.jsonl")
    assert (fault["kind"], fault["phase"], fault["steps_seen"]) == ("drain", "the final checkpoint staged", 2)
    assert procs[fault["name"]].wait(timeout=10) == -signal.SIGKILL
    (run_dir / "summary.json").write_text("{}")  # the run has finished: nothing left to hit
    monkey_for(run_dir, kinds=frozenset({"drain"}))._drain()
    assert len(load_faults(run_dir.parent / "kills.jsonl")) == 1


def test_the_bench_passes_the_learner_ranks_and_refuses_what_it_sets_itself(tmp_path, capsys):
    args = arguments(["--faults", "stuck,kill,snapshot", "--learner-ranks", "2", "--out-dir", str(tmp_path / "o")])
    assert args.faults == ["kill", "snapshot", "stuck"]
    assert overrides(args) == ["learner.steps=350", "max_restarts=40", "learner.save_every=10", "rollout.num_actors=2",
                               "learner.world_size=2", "learner.cpus_per_rank=0.5"]
    assert arguments(["--out-dir", str(tmp_path / "o")]).faults == ["kill"]  # the default: the bench as it was
    with pytest.raises(SystemExit):
        arguments(["--extra", "learner.world_size=2", "--out-dir", str(tmp_path / "o")])
    assert "use --learner-ranks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        arguments(["--faults", "kill,sigstop", "--out-dir", str(tmp_path / "o")])
    assert "unknown kind sigstop; choose from kill,snapshot,stuck,join,startup,drain,env" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the table
STEPS = [100, 103, 107, 109, 150, 152, 170, 174, 176, 200, 203, 260, 263]


def test_idle_is_the_largest_step_gap_until_the_run_is_back():
    # a fault at 110 whose restart takes 45 s: back at 155, so the gaps up to the first step at or after
    # 155 (170) count, from the last step before the fault (109): 41, 2, 18 -> 41
    assert idle_around(STEPS, 110, 155) == (41, 109, 170, False)
    # the next fault at 120 ends its count: 109 -> 120 = 11, and the gaps after 120 are that fault's
    assert idle_around(STEPS, 110, 155, next_fault=120) == (11, 109, 170, True)
    assert idle_around(STEPS, 110, 155, next_fault=180) == (41, 109, 170, False)  # back (170) before it
    # a fault before the first step counts from the fault: 100 - 90 = 10
    assert idle_around(STEPS, 90, 90) == (10, 90, 100, False)
    assert idle_around(STEPS, 270, 270) is None  # no step after it
    # all gaps: 3 4 2 41 2 18 4 2 24 3 57 3; without those touching (109, 170) and (203, 260):
    # 3 4 2 4 2 24 3 3 -> sorted 2 2 3 3 3 4 4 24 -> median 3
    assert typical_gap(STEPS, [(109, 170), (203, 260)]) == 3


def test_the_per_fault_table(tmp_path):
    path = tmp_path / "kills.jsonl"
    records = [
        {"t_s": 40, "role": "actor", "name": "actor/0", "pid": 9, "steps_seen": 0},  # the bench before issue 33
        {"kind": "startup", "t_s": 30, "epoch": 90, "role": "actor", "name": "actor", "pid": 8,
         "phase": "roles starting (no processes.json yet)"},
        {"kind": "kill", "t_s": 50, "epoch": 110, "role": "actor", "name": "actor/0", "pid": 10},
        {"kind": "stuck", "t_s": 117, "epoch": 177, "role": "actor", "name": "actor/1 engine core", "pid": 77,
         "actor_pid": 11, "stuck_s": 20},
        {"kind": "cont", "of": 3, "epoch": 197, "sent": True},
        {"kind": "kill", "t_s": 144, "epoch": 204, "role": "learner", "name": "learner/1", "pid": 30},
        {"kind": "drain", "t_s": 210, "epoch": 270, "role": "buffer", "name": "buffer", "pid": 40},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    faults = load_faults(path)
    assert [f["kind"] for f in faults] == ["kill", "startup", "kill", "stuck", "kill", "drain"]
    events = [Restart("actor", 10, 45.0), Restart("learner", 30, None)]
    rows, typical = fault_rows(faults, events, STEPS)
    # idle: old record no time; start-up 100 - 90 = 10 from the fault; actor kill 41 (above); the stuck core
    # (20 s, not restarted) is back at 197: gaps to the first step at or after it, from 176: 200 - 176 = 24;
    # the learner (no time in its line): the first step after 204 is 260: 260 - 203 = 57; drain: none after
    assert [(r["restart_s"], r["idle_s"]) for r in rows] == [
        (None, None), (None, 10), (45.0, 41), (None, 24), (None, 57), (None, None)]
    # without (90,100), (109,170), (176,200), (203,260): 3 4 2 4 2 3 3 -> median 3
    assert typical == 3
    text = fault_table(rows, typical)
    assert "| 3 | SIGKILL | actor/0 (pid 10) | 50 s | 45 s | 41 s (0.91× the restart) |  |" in text  # 41/45
    assert "| 2 | SIGKILL at start-up | actor (pid 8) | 30 s | none reported | 10 s from the fault (no step before it)" \
           " | roles starting (no processes.json yet) |" in text
    assert "| 4 | SIGSTOP of an engine core | actor/1 engine core (pid 77) | 117 s | none reported | 24 s | " \
           "stopped for 20 s: SIGCONT sent then |" in text
    assert "| 5 | SIGKILL | learner/1 (pid 30) | 144 s | – (its line gives no time) | 57 s |  |" in text
    assert "| 6 | SIGKILL in the final drain/checkpoint | buffer (pid 40) | 210 s | none reported | – (no step after " \
           "it) | after the last step's progress line |" in text
    assert "Typical step gap outside the faults (median): 3 s" in text
