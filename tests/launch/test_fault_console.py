"""A learner rank killed with SIGKILL, as the console of `algo-train` shows it: one line of ours naming
the rank, its pid, its host and its log, with what the run does next — and nothing of Ray's.

The run's process is real up to the process graph: `launch.commands.supervisor._child` (the child `algo-train`
supervises) runs in a subprocess, with the run's console set-up and a real local Ray (`init_ray`), and
`launch.loop.graph.run_graph` replaced by the learner side of a run: a `ProcessGraph` whose two ranks are
stand-ins (a whole learner would only make this slower) writing to their logs as ranks do
(`launch.processes.roles.to_log_file`). Rank 1 is SIGKILLed in the middle of a step. The launcher's half (what
`launch.commands.train` says once the child has exited) runs here, on what the child left. The actor and buffer
kills are asserted on a real run's console in `tests/e2e/test_fleet_e2e.py`.

Run as `python -m tests.launch.test_fault_console SPEC RUN_DIR`, this module is that child.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

from configs.loading import resolve
from launch.commands.console import quiet_env
from launch.commands.supervisor import LEARNER_DIED, death_note
from launch.commands.train import after_run, restart_after_learner_deaths
from launch.processes.roles import LOG_FILE_ENV, to_log_file, where
from tests.launch.test_run_folders import make_run

REPO = Path(__file__).parents[2]


class Rank:
    """A learner rank's process as the driver sees it (`launch.processes.roles.LearnerRank`'s method names)."""

    def __init__(self, rank: int):
        to_log_file()
        self.rank = rank

    def where(self) -> dict:
        return where()

    def step(self, groups, version: int) -> dict:
        print(f"learner rank {self.rank}: training step {version}")
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would: no last words
        return {"version": version}

    def die_in(self, seconds: float) -> None:
        threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGKILL)).start()

    def close(self) -> None:
        pass


STARVED = "IMPALA_TEST_STARVED"  # set: the child's driver waits for a batch that never comes while rank 0 dies


class StarvedBuffer:
    """A buffer with nothing to give: every pull waits its whole timeout (as when every engine lost its
    version with the learner rank that was pushing to it, so no actor starts a prompt)."""

    def pull_batch(self, n: int, timeout_s: float):
        time.sleep(timeout_s)
        raise TimeoutError


def starved_pull(graph, run_dir: Path) -> int:
    """The driver's wait for a batch (`Driver._pull`, its real loop) while learner rank 0 dies 1 s in; the
    seconds from the death to `LearnerDied` go to run_dir/acted_s."""
    from launch.loop.driver import Driver

    driver = Driver.__new__(Driver)  # what `_pull` uses, as `Driver(...)` sets it
    driver.cfg, driver.graph, driver.demos, driver._stop_requested = graph.cfg, graph, None, False
    driver.recovery = types.SimpleNamespace(call_on_live_buffer=lambda call: call(StarvedBuffer()),
                                            check_actors=dict, settle_push=dict, admit_successors=bool)
    graph.ranks[0].die_in.remote(1.0)
    died = time.monotonic() + 1.0
    try:
        driver._pull()
        return 0
    finally:
        (run_dir / "acted_s").write_text(f"{time.monotonic() - died:.1f}")


def learner_side(cfg, run_dir: Path, progress) -> int:
    """`launch.loop.graph.run_graph` cut down to the learner: two ranks, a step that loses rank 1."""
    import ray

    from launch.planning.cluster import init_ray
    from launch.processes.process_graph import ProcessGraph

    init_ray(cfg)
    graph = ProcessGraph.__new__(ProcessGraph)  # what the learner calls use, as `ProcessGraph(...)` sets it
    graph.cfg, graph.serial, graph._ray, graph.log = cfg, False, ray, progress.message
    graph.actors, graph.live, graph._where, graph.log_dir = [], [], {}, run_dir / "logs"
    graph.ranks = [ray.remote(Rank).options(num_cpus=0, max_restarts=0, runtime_env={
        "env_vars": {LOG_FILE_ENV: str(graph.log_file(f"learner-{r}"))}}).remote(r) for r in range(2)]
    try:
        graph.where()  # processes.json's look-up: the pid and host the message names
        if os.environ.get(STARVED):
            return starved_pull(graph, run_dir)
        graph.step([1, 2], 5)
        return 0
    finally:
        graph.shutdown()


def test_a_killed_learner_rank_is_one_console_line_naming_it_its_log_and_what_happens(tmp_path):
    run = tmp_path / "r"
    make_run(run, 6)  # a checkpoint at step 6 to go on from
    cfg = resolve("grpo", flags={"logging.progress": "plain"})
    spec = tmp_path / "spec.json"
    spec.write_text(cfg.model_dump_json())
    env = {**os.environ, **quiet_env(cfg, starts_local_ray=True, environ=os.environ)}  # as `launch.commands.train` sets it
    child = subprocess.run([sys.executable, "-m", "tests.launch.test_fault_console", str(spec), str(run)],
                           capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert child.returncode == LEARNER_DIED, child.stderr[-3000:]
    # the run's process says nothing itself: what Ray says of the death ("(raylet) A worker died or was
    # killed ...", at a time of its choosing) goes to the run's log folder, and closing the dead rank is silent
    assert (child.stdout, child.stderr) == ("", ""), child.stdout + child.stderr
    assert (run / "logs" / "ray.log").is_file()

    log = run / "logs" / "learner-1.log"
    header, *lines = log.read_text().splitlines()
    pid = int(re.fullmatch(rf"--- learner-1: pid (\d+) on {re.escape(socket.gethostname())}, [\d:\- ]+ ---",
                           header).group(1))
    assert lines == ["learner rank 1: training step 5"]  # what it wrote up to its SIGKILL is all there
    dead = (rf"learner rank 1 \(pid {pid} on {re.escape(socket.gethostname())}; log {re.escape(str(log))}\) died "
            r"\(process gone: ActorDiedError\)")
    note = death_note(run).read_text()

    said = []  # with --max-restarts: one line, the death and the restart
    restarted = resolve("grpo", flags={"max_restarts": 1}, overrides=["learner.save_every=2"])
    assert restart_after_learner_deaths(LEARNER_DIED, restarted, run, lambda c, d: 0, said.append) == 0
    assert len(said) == 1 and re.fullmatch(rf"\[learner\] {dead}; restart 1 of 1: resuming {re.escape(str(run))} from step 6",
                                           said[0]), said
    death_note(run).write_text(note)  # without: one line, the death and the command that goes on
    line = after_run(LEARNER_DIED, run)
    assert re.fullmatch(rf"\[learner\] {dead}; the run stopped; continue from step 6: algo-train --resume {re.escape(str(run))}",
                        line), line
    assert not death_note(run).exists()


def test_a_learner_rank_killed_while_the_driver_waits_for_a_batch_stops_the_run_within_seconds(tmp_path):
    # The chaos run of issue 33 (seed 3): rank 0 killed with a push on the wire, every engine left without a
    # version, the buffer starved, and the driver waited in its pull for 6.5 minutes, looking only at the
    # actors. Now each empty poll (PULL_POLL_S = 5 s) also asks the ranks: LearnerDied within one poll.
    run = tmp_path / "r"
    make_run(run, 6)
    cfg = resolve("grpo", flags={"logging.progress": "plain"})
    spec = tmp_path / "spec.json"
    spec.write_text(cfg.model_dump_json())
    env = {**os.environ, **quiet_env(cfg, starts_local_ray=True, environ=os.environ), STARVED: "1"}
    child = subprocess.run([sys.executable, "-m", "tests.launch.test_fault_console", str(spec), str(run)],
                           capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert child.returncode == LEARNER_DIED, child.stderr[-3000:]
    assert re.match(r"learner rank 0 \(pid \d+ .*\) died \(process gone: \w+\)", death_note(run).read_text())
    acted_s = float((run / "acted_s").read_text())
    print(f"driver acted {acted_s:.1f} s after the rank's death")
    assert acted_s <= 30, acted_s  # the bound; one poll is 5 s


def test_a_stop_asked_for_is_honoured_even_when_a_learner_rank_dies_during_it(tmp_path):
    # The chaos run of issue 33: SIGTERM woke the starved driver, the rank's death then ended the run, and
    # --max-restarts resumed it from step 60 and trained on. A stop asked for now ends the run as stopped.
    from launch.commands.supervisor import run_status

    assert run_status(LEARNER_DIED, stop_asked=False) == LEARNER_DIED  # no stop: --max-restarts may resume it
    assert run_status(LEARNER_DIED, stop_asked=True) == 130
    assert run_status(0, stop_asked=True) == 0 and run_status(-signal.SIGINT, stop_asked=False) == 130
    run = tmp_path / "r"
    make_run(run, 6)
    death_note(run).write_text("learner rank 0 (pid 7 on vm; log x) died (process gone: ActorDiedError)\n")
    restarts = []
    cfg = resolve("grpo", flags={"max_restarts": 3}, overrides=["learner.save_every=2"])
    assert restart_after_learner_deaths(130, cfg, run, lambda c, d: restarts.append(c) or 0, print) == 130
    assert restarts == []
    assert after_run(130, run) == ("[learner] learner rank 0 (pid 7 on vm; log x) died (process gone: "
                                   f"ActorDiedError); the run stopped; continue from step 6: algo-train --resume {run}")


def test_what_ray_prints_in_the_run_process_goes_to_the_log_and_ours_to_the_console():
    import io
    import logging
    import threading

    from launch.commands.console import RayToLog

    console, log = io.StringIO(), io.StringIO()
    out = RayToLog(console, log)
    print("\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task", file=out)  # two writes
    print("(ActorRole pid=4242) Triton is installed, but doesn't include CPU backend.", file=out)
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"))
    record = logging.LogRecord("ray", logging.ERROR, "worker.py", 440, "Unhandled error: ActorDiedError\n"
                               "\tclass_name: ActorRole\n\tpid: 4242", None, None)
    handler.emit(record)  # Ray's logger: the whole record, its traceback lines too
    out.write("\r\x1b[2Kstep 3/10 | 9.0 samples/s")  # a live progress line, not ended ...
    ray_thread = threading.Thread(target=print, args=("(raylet) Failed to send wait complete",), kwargs={"file": out})
    ray_thread.start()  # ... while Ray's thread prints
    ray_thread.join()
    print("\n[actor] actor 0 (pid 4242 on vm; log x/actor-0.log) died (process gone: ActorDiedError); ...", file=out)
    assert console.getvalue() == ("\r\x1b[2Kstep 3/10 | 9.0 samples/s\n[actor] actor 0 (pid 4242 on vm; log "
                                  "x/actor-0.log) died (process gone: ActorDiedError); ...\n")
    assert log.getvalue().splitlines()[:2] == ["\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a "
                                               "task", "(ActorRole pid=4242) Triton is installed, but doesn't include "
                                               "CPU backend."]
    assert log.getvalue().splitlines()[3:] == ["\tclass_name: ActorRole", "\tpid: 4242",
                                               "(raylet) Failed to send wait complete"]


if __name__ == "__main__":  # the run's process (`launch.commands.supervisor._child`) with `learner_side` as its graph
    from launch.commands.supervisor import _child

    sys.modules["launch.loop.graph"] = types.SimpleNamespace(run_graph=learner_side)
    sys.exit(_child(sys.argv[1], sys.argv[2]))


def test_a_role_the_run_could_not_replace_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    import launch.loop.graph
    from launch.commands.supervisor import _child
    from launch.processes.process_graph import RoleLost

    def lost(cfg, run_dir, progress):
        raise RoleLost("[buffer] the buffer process (pid 1 on vm; log x) died (exit code -9); starting a new one "
                       "failed (RuntimeError: port taken); the run stopped")

    monkeypatch.setattr(launch.loop.graph, "run_graph", lost)
    spec = tmp_path / "spec.json"
    spec.write_text(resolve("grpo", flags={"logging.progress": "plain", "logging.verbose": True}).model_dump_json())
    assert _child(str(spec), str(tmp_path)) == 1
    out = capsys.readouterr()
    assert out.err.strip().splitlines() == ["[buffer] the buffer process (pid 1 on vm; log x) died (exit code -9); "
                                            "starting a new one failed (RuntimeError: port taken); the run stopped"]
    assert after_run(1, tmp_path).startswith("[stop] the run failed (exit status 1)")  # and how to go on
