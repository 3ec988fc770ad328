"""Run the training in a child process of its own session, and forward stop signals to it.

Why: a terminal's Ctrl-C (and `timeout`, and most job runners) signals the whole foreground process
group. Ray's GCS/raylet, the buffer and the vLLM engine processes are children of the run and would
die before the driver could drain the actors, snapshot the buffer and write a checkpoint. So the
`algo-train` process only supervises: the run (driver + everything it starts) lives in a new session,
the supervisor forwards the first two SIGINT/SIGTERM to the driver alone (1st: graceful stop, 2nd:
abort), a third kills the session, and once the driver has exited anything still alive in its session
is killed — no process is left behind. A run that was asked to stop ends as stopped (130) whatever else
ended it, so a learner rank that dies during the stop does not restart it (`--max-restarts`).

A dead learner rank ends the child with LEARNER_DIED and one line naming it in `death_note(run_dir)`; the
launcher says it, with what the run does next, in one console line (`launch.commands.train`). What Ray prints in
the child goes to run_dir/logs/ray.log (`launch.commands.console.divert_ray_output`), not to the terminal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from configs.schema import RunConfig

LEARNER_DIED = 3  # exit status of a run stopped by a dead learner rank (`launch.processes.process_graph.LearnerDied`)


def death_note(run_dir: Path) -> Path:
    """Where the child leaves the line naming a dead learner rank for the launcher (`take_death_note`)."""
    return run_dir / ".learner-died"


def take_death_note(run_dir: Path) -> str | None:
    """The line the child left on a learner rank's death (None: none), removed once read."""
    note = death_note(run_dir)
    try:
        text = note.read_text().strip()
    except FileNotFoundError:
        return None
    note.unlink()
    return text or None


def supervise(cfg: RunConfig, run_dir: Path) -> int:
    spec = run_dir / ".run_config.json"
    spec.write_text(cfg.model_dump_json())
    env = dict(os.environ)
    if cfg.serial:  # the learner and the actors live in the run's process: quiet it as their processes are
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # (launch.processes.actor_role.actor_env); read when torch loads
        env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    proc = subprocess.Popen([sys.executable, "-m", "launch.commands.supervisor", str(spec), str(run_dir)],
                            start_new_session=True, env=env)
    signals = 0

    def forward(signum, frame):
        nonlocal signals
        signals += 1
        if signals <= 2:
            proc.send_signal(signum)
        else:
            _kill_session(proc.pid)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _kill_session(proc.pid)
        spec.unlink(missing_ok=True)
    return run_status(rc, stop_asked=signals > 0)


def run_status(rc: int, stop_asked: bool) -> int:
    """The launcher's status of a run whose process exited `rc`: 130 (stopped) for a run asked to stop,
    whatever else ended it (a learner rank that died during the stop must not get it restarted), and for
    one ended by SIGINT; else `rc`."""
    return 130 if (stop_asked and rc != 0) or rc in (-signal.SIGINT, 130) else rc


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (the run's; ours is never it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    out = subprocess.run(["ps", "-eo", "sid=,pid="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == str(sid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(parts[1]), signal.SIGKILL)


def _child(spec: str, run_dir: str) -> int:
    from launch.commands.console import divert_ray_output
    from launch.loop.graph import run_graph
    from launch.loop.progress import Progress
    from launch.planning.resources import ResourceError
    from launch.processes.learner_ranks import LearnerDied
    from launch.processes.process_graph import RoleLost
    from launch.state.storage import StorageError

    cfg = RunConfig.model_validate_json(Path(spec).read_text())
    if not cfg.logging.verbose:
        divert_ray_output(Path(run_dir) / "logs" / "ray.log")
    progress = Progress(cfg.learner.steps, cfg.logging.progress)
    try:
        return run_graph(cfg, Path(run_dir), progress)
    except (ResourceError, StorageError) as e:  # found once Ray is up (placement, shared storage): no traceback
        print(f"algo-train: {e}", file=sys.stderr)
        return 2
    except RoleLost as e:  # one line of ours; the launcher adds how to go on (`launch.commands.train.after_run`)
        progress.close()
        print(str(e), file=sys.stderr)
        return 1
    except LearnerDied as e:  # the launcher says it, with what the run does next
        progress.close()
        death_note(Path(run_dir)).write_text(f"{e}\n")
        return LEARNER_DIED


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
