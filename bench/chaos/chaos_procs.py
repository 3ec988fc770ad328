"""What the chaos bench reads from /proc and the run folder to pick its victims (bench/chaos/chaos.py), without
psutil: the run's processes by role, an actor's vLLM engine core, and the moment a checkpoint writes its
buffer snapshot.

- The run's driver is the process `python -m launch.commands.supervisor SPEC RUN_DIR`, in a session of its
  own (`launch.commands.supervisor`); every process of the run is in that session. Before processes.json
  exists (written once the engines are up, `launch.loop.graph`), roles are told apart by their titles:
  Ray names a worker after its actor class ("ray::ActorRole...", "ray::LearnerRank..."), and the buffer
  service is a `multiprocessing` spawn child of the driver ("... spawn_main(...) --multiprocessing-fork").
- An actor's engine core is a child process of the actor titled "VLLM::EngineCore" (`actors.engine_fork`:
  forked on CPU, spawned on GPUs: a descendant either way).
- A checkpoint is staged in checkpoints/.step_N.tmp (`learner.checkpoint.stage`): the learner ranks write
  their part, rank 0's learner_state.json last (`finish_learner_part`); the driver then asks the buffer for
  its snapshot, which the buffer writes to a temp file ".buffer-snapshot-*" beside buffer.msgpack and renames
  (`buffer.snapshot.write_snapshot`); then the checkpoint is committed (renamed to step_N). From
  learner_state.json to buffer.msgpack, the snapshot is being asked for or written.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TITLES = {"actor": "ray::ActorRole", "learner": "ray::LearnerRank"}  # Ray's worker titles (launch.processes)
SNAPSHOT_FILE, SNAPSHOT_TEMP, LEARNER_PART = "buffer.msgpack", ".buffer-snapshot-", "learner_state.json"
STAGED = "the final checkpoint staged"  # `final_phase`
KV_LINE = "[engine] KV cache:"  # an actor's engine is built (actors.engine.kv_cache_line, in logs/actor-<i>.log)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    session: int
    state: str  # R, S, T (stopped), Z (zombie), ...
    start: int  # clock ticks after boot it started at (/proc/PID/stat field 22): tells a reused pid apart
    cmdline: str  # its arguments joined by spaces (a title set by setproctitle included)


def read_proc(pid: int, root: Path = PROC) -> Proc | None:
    """/proc/PID of one process; None when it is gone."""
    try:
        stat = (root / str(pid) / "stat").read_text()
        raw = (root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and parentheses
    try:
        return Proc(pid, int(rest[1]), int(rest[3]), rest[0], int(rest[19]),
                    " ".join(a for a in raw.decode(errors="replace").split("\0") if a).strip())
    except (IndexError, ValueError):
        return None


def state_becomes(pid: int, want: str, within_s: float = 5.0) -> bool:
    """Whether process `pid`'s state becomes `want` ("T", or "not T") within `within_s` seconds: a SIGSTOP or
    SIGCONT takes effect when the kernel next schedules the process, which on a loaded machine is not at once."""
    deadline = time.monotonic() + within_s
    while True:
        p = read_proc(pid)
        state = p.state if p is not None else ""
        if (state != "T") if want == "not T" else state == want:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def read_procs(root: Path = PROC) -> dict[int, Proc]:
    """Every process /proc lists now, by pid."""
    procs = {}
    for entry in os.listdir(root):
        if entry.isdigit() and (p := read_proc(int(entry), root)) is not None:
            procs[p.pid] = p
    return procs


def alive_in(pid: int, session: int, root: Path = PROC) -> bool:
    """Whether `pid` runs (not a zombie) in session `session` (the run's: a reused pid elsewhere is not it)."""
    p = read_proc(pid, root)
    return p is not None and p.session == session and p.state != "Z"


def descendants(procs: dict[int, Proc], pid: int) -> list[Proc]:
    """The children of `pid`, their children, ..., in pid order."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(procs[c])
            todo.append(c)
    return sorted(out, key=lambda p: p.pid)


def find_driver(procs: dict[int, Proc], run_dir: Path) -> Proc | None:
    """The run's driver process (module docstring), the newest when a learner restart started another."""
    want = Path(run_dir).resolve()
    found = [p for p in procs.values() if "launch.commands.supervisor" in p.cmdline and p.state != "Z"
             and Path(p.cmdline.split()[-1]).resolve() == want]
    return max(found, key=lambda p: p.start, default=None)


def run_roles(procs: dict[int, Proc], driver: int) -> dict[str, list[int]]:
    """{actor, learner, buffer: pids} of the run's processes by their titles (module docstring)."""
    session = procs[driver].session if driver in procs else None
    live = [p for p in procs.values() if p.session == session and p.state != "Z"]
    # a role's forked child keeps its title until it sets its own: the role is the topmost process of a title
    out = {role: sorted(p.pid for p in live if p.cmdline.startswith(title)
                        and not (p.ppid in procs and procs[p.ppid].cmdline.startswith(title)))
           for role, title in TITLES.items()}
    out["buffer"] = sorted(p.pid for p in live if p.ppid == driver and "spawn_main" in p.cmdline)
    return out


def engine_cores(procs: dict[int, Proc], actor: int) -> list[Proc]:
    """The vLLM engine-core processes of actor process `actor` (module docstring)."""
    return [p for p in descendants(procs, actor) if "EngineCore" in p.cmdline and p.state != "Z"]


def snapshot_window(checkpoints: Path, since: float = 0.0) -> tuple[Path, str] | None:
    """(staged checkpoint, what shows it) while a checkpoint's buffer snapshot is asked for or written (module
    docstring): the buffer's temp file in the staged folder, or the learner's part there without the
    snapshot; None otherwise. Only files written at `since` (epoch seconds) or later count: a save that a kill
    interrupted leaves its staged folder, and a SIGKILLed buffer its temp file, until the step is saved again."""
    try:
        staged = sorted(d for d in os.listdir(checkpoints) if d.startswith(".step_") and d.endswith(".tmp"))
    except OSError:
        return None
    for name in staged:
        try:
            files = os.listdir(checkpoints / name)
        except OSError:  # committed (renamed) meanwhile
            continue
        temp = next((f for f in files if f.startswith(SNAPSHOT_TEMP) and _written_since(checkpoints / name / f, since)),
                    None)
        if temp is not None:
            return checkpoints / name, f"{name}: the buffer's temp file {temp} written"
        if (LEARNER_PART in files and SNAPSHOT_FILE not in files
                and _written_since(checkpoints / name / LEARNER_PART, since)):
            return checkpoints / name, f"{name}: the learner's part written, the buffer's snapshot not yet"
    return None


def _written_since(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def final_phase(run_dir: Path, steps: int) -> str | None:
    """Where a run past its last step is (`launch.loop.driver.Driver._finish`: drain the actors, write the final
    checkpoint, export it, write summary.json); None once summary.json is written."""
    if (run_dir / "summary.json").exists():
        return None
    if (run_dir / "checkpoints" / f".step_{steps}.tmp").is_dir():
        return STAGED
    return "no checkpoint staged (draining the actors, or exporting)"


def open_fds(pid: int, root: Path = PROC) -> int | None:
    """How many file descriptors `pid` has open (/proc/PID/fd); None when gone."""
    try:
        return len(os.listdir(root / str(pid) / "fd"))
    except OSError:
        return None


def actor_logs(run_dir: Path, actor: int) -> list[Path]:
    """The log files of actor `actor` in the run folder (launch.processes.roles.to_log_file: its successors append
    to its file)."""
    return sorted((Path(run_dir) / "logs").glob(f"actor-{actor}.*"))


def kv_lines(logs: list[Path]) -> int:
    """How many engines these logs say were built so far (their KV-cache lines)."""
    n = 0
    for path in logs:
        with contextlib.suppress(OSError):
            n += path.read_text(errors="replace").count(KV_LINE)
    return n


def joined_lines(console: str, actor: int) -> int:
    """How many times the run's console says a successor of actor `actor` joined (launch.state.recovery)."""
    return len(re.findall(rf"^\[actor\] actor {actor} (?!\(pid).*?(?:restarted as pid|joined)", console, re.M))
