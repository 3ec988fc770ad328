"""The chaos bench's fault injector (bench/chaos/chaos.py says what each fault is and when it comes).

Random draws: the periodic SIGKILL's victims come from random.Random(seed) exactly as before the other faults
existed (`--faults kill`, the default, draws nothing else from it), so an earlier command's victims are drawn
the same; which periodic fault comes next, and the start-up and drain faults, draw from RNGs of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.chaos.chaos_console import progress
from bench.chaos.chaos_procs import (
    STAGED,
    actor_logs,
    alive_in,
    engine_cores,
    final_phase,
    find_driver,
    joined_lines,
    kv_lines,
    open_fds,
    read_proc,
    read_procs,
    run_roles,
    snapshot_window,
)
from bench.common.runs import log

ROLES = ("actor", "buffer", "learner")
PERIODIC = ("kill", "snapshot", "stuck", "join")  # every ~every_s seconds of training, one of these (drawn)
ONCE = ("startup", "drain")  # at most once per run
CONFIG = ("env",)  # a fault of the run's config, not injected by the monkey (bench/chaos/chaos_env.py)
KINDS = PERIODIC + ONCE + CONFIG
# a learner rank killed before the first checkpoint stops the run for good, by design ("start it over",
# docs/running.md): a start-up fault therefore hits an actor or the buffer
STARTUP_ROLES = ("actor", "buffer")
STALL_S = 5.0  # seconds without a new step after which the run counts as not training (restarting, evaluating)
JOIN_HUNT_S = 600.0  # a join fault gives up when the successor's engine is not up within this
HUNT_POLL_S = 0.002  # how often the snapshot fault looks for its window (a snapshot of the tiny run takes ms)
FINAL_POLL_S, NEAR_END = 0.05, 3  # with a drain fault, the log is read this often from NEAR_END steps before the end


@dataclass(frozen=True)
class FaultPlan:
    every_s: float  # mean seconds of training between periodic faults
    seed: int
    kinds: frozenset[str] = frozenset({"kill"})
    stuck_s: float = 60.0  # how long a stuck engine core stays SIGSTOPped
    startup_within_s: float = 30.0  # a start-up kill comes 0..this after its victim's process appears
    join_stall_s: float = 45.0  # how long a successor's engine core is held in the weight-sync join


class Monkey(threading.Thread):
    """Injects the faults of `plan` into the run in `run_dir` until `done` is set; each fault is a JSON line in
    `faults_path` (and `faults`), each SIGCONT of a stuck engine core a {"kind": "cont", "of": index} line."""

    def __init__(self, run_dir: Path, log_path: Path, plan: FaultPlan, faults_path: Path):
        super().__init__(daemon=True)
        self.run_dir, self.log_path, self.plan, self.faults_path = run_dir, log_path, plan, faults_path
        self.rng = random.Random(plan.seed)  # the periodic kills' victims (module docstring)
        self.kind_rng, self.once_rng = random.Random(f"{plan.seed}/kinds"), random.Random(f"{plan.seed}/once")
        self.periodic = [k for k in PERIODIC if k in plan.kinds]
        self.done, self.faults = threading.Event(), []
        self.stopped: list[tuple[float, int, int, int]] = []  # SIGSTOPped cores: (SIGCONT due, pid, start, fault)
        self.t0 = time.monotonic()
        self.most_actors = 0  # the most actors processes.json has listed: fewer = some are restarting

    def progress(self) -> tuple[int, int, int]:
        """(progress lines so far, the last one's step, the steps asked) of the run's console."""
        try:
            return progress(self.log_path.read_text(errors="replace"))
        except OSError:
            return 0, 0, 0

    def steps_seen(self) -> tuple[int, bool]:
        """(progress lines so far, whether the last one is the run's last step)."""
        seen, step, total = self.progress()
        return seen, bool(total) and step == total

    def run(self) -> None:
        try:
            self._startup()
            if not self.done.is_set():
                self._train()
            self._drain()
            while self.stopped and not self.done.wait(0.2):  # a stuck engine core still due its SIGCONT
                self._cont()
        finally:
            self._cont(everything=True)  # never leave an engine core stopped

    # ------------------------------------------------------------------ the phases
    def _startup(self) -> None:
        """One SIGKILL of an actor or the buffer before the first step, `startup_within_s` at most after the
        victim's process appeared (found by its title: processes.json comes only once the engines are up)."""
        if "startup" not in self.plan.kinds:
            return
        role = self.once_rng.choice(STARTUP_ROLES)
        delay, first_seen = self.once_rng.uniform(0, self.plan.startup_within_s), None
        while not self.done.wait(0.2):
            if self.steps_seen()[0]:
                log(f"[chaos] start-up fault missed: the first step came before the {role} kill was due")
                return
            procs = read_procs()
            driver = find_driver(procs, self.run_dir)
            pids = run_roles(procs, driver.pid)[role] if driver else []
            if not pids:
                continue
            first_seen = first_seen or time.monotonic()
            if time.monotonic() - first_seen < delay:
                continue
            pid = self.once_rng.choice(pids)
            listed = {int(v["pid"]): k for k, v in (self._roles() or {}).items() if "pid" in v}
            phase = "engines up, before the first step" if listed else "roles starting (no processes.json yet)"
            if self._signal(signal.SIGKILL, {"kind": "startup", "role": role, "name": listed.get(pid, role),
                                             "pid": pid, "phase": phase}, 0):
                return

    def _train(self) -> None:
        """The periodic faults, one every ~every_s seconds of training (a second counts while the run has
        finished a step within STALL_S, has a committed checkpoint to resume from, has all its actors (none
        restarting: training goes on during an actor's restart, and a fault then would be read as part of that
        one) and no engine core stopped), until the last step's progress line."""
        from learner.committed import committed_steps

        last, poll = time.monotonic(), 1.0
        gap, trained_s, seen_before, moved_at = self._gap(), 0.0, 0, None
        while not self.done.wait(poll):
            now, (seen, step, total) = time.monotonic(), self.progress()
            last_step = bool(total) and step == total
            if "drain" in self.plan.kinds and total and step >= total - NEAR_END:
                poll = FINAL_POLL_S  # the drain fault's window opens at the last step's line
            self._cont()
            if last_step:  # the run is finishing (drain, evaluation, final checkpoint): no more periodic faults
                return
            if seen > seen_before:
                seen_before, moved_at = seen, now
            if (moved_at is not None and now - moved_at < STALL_S and not self.stopped and self.all_actors()
                    and committed_steps(self.run_dir / "checkpoints")):
                trained_s += now - last  # the run is training (a step within STALL_S), and can be resumed
            last = now
            if trained_s < gap or not self.periodic:
                continue
            kind = self.periodic[0] if len(self.periodic) == 1 else self.kind_rng.choice(self.periodic)
            if {"kill": self._kill, "snapshot": self._snapshot, "stuck": self._stick, "join": self._join}[kind](seen):
                gap, trained_s, moved_at, last = self._gap(), 0.0, None, time.monotonic()

    def _drain(self) -> None:
        """One SIGKILL of a random role after the last step's progress line: at once (the run drains its
        actors then) or once the final checkpoint is staged (drawn); missed when summary.json comes first.
        The quick-start's whole end, drain to summary.json, took 0.5-1.5 s on 2 cores, hence no random delay."""
        if "drain" not in self.plan.kinds:
            return
        role, at_checkpoint = self.once_rng.choice(ROLES), self.once_rng.random() < 0.5
        seen, _, total = self.progress()
        while not self.done.is_set():
            if (phase := final_phase(self.run_dir, total)) is None:
                break
            if at_checkpoint and phase != STAGED:
                time.sleep(HUNT_POLL_S)
                continue
            roles = self._roles() or {}
            names = sorted(r for r in roles if r.split("/")[0] == role)
            session = _session(roles)
            if names and session is not None:
                name = self.once_rng.choice(names)
                pid = int(roles[name]["pid"])
                if alive_in(pid, session) and self._signal(signal.SIGKILL, {
                        "kind": "drain", "role": role, "name": name, "pid": pid, "phase": phase}, seen):
                    return
            self.done.wait(FINAL_POLL_S)
        log(f"[chaos] drain fault missed: the run had finished before the {role} kill"
            + (" at the final checkpoint" if at_checkpoint else ""))

    # ------------------------------------------------------------------ the periodic faults
    def _kill(self, seen: int) -> bool:
        """SIGKILL a random role (actor, buffer, learner rank; equally likely), then which one of it."""
        roles = self._roles()
        if roles is None:
            return False
        role = self.rng.choice(ROLES)
        names = sorted(r for r in roles if r.split("/")[0] == role)
        if not names:  # every actor is restarting: processes.json lists none
            return False
        name = self.rng.choice(names)
        pid, session = int(roles[name]["pid"]), _session(roles)
        if session is None or not alive_in(pid, session):  # processes.json not yet rewritten: next second
            return False
        return self._signal(signal.SIGKILL, {"kind": "kill", "role": role, "name": name, "pid": pid}, seen)

    def _snapshot(self, seen: int) -> bool:
        """SIGKILL the buffer while the next checkpoint's snapshot is asked for or written
        (`chaos_procs.snapshot_window`); gives up at the last step. `landed`: the snapshot was still missing
        right after the kill."""
        checkpoints, next_look, since = self.run_dir / "checkpoints", time.monotonic() + 1.0, time.time()
        while not (window := snapshot_window(checkpoints, since)):
            if self.done.is_set():
                return False
            if time.monotonic() >= next_look:
                if self.steps_seen()[1]:
                    return False
                next_look = time.monotonic() + 1.0
            time.sleep(HUNT_POLL_S)
        staged, what = window
        roles = self._roles() or {}
        session = _session(roles)
        pid = int(roles.get("buffer", {}).get("pid", 0))
        if session is None or not pid or not alive_in(pid, session):
            return False
        return self._signal(signal.SIGKILL, {"kind": "snapshot", "role": "buffer", "name": "buffer", "pid": pid,
                                             "window": what}, seen,
                            after=lambda: {"landed": staged.is_dir() and not (staged / "buffer.msgpack").exists()})

    def _stick(self, seen: int) -> bool:
        """SIGSTOP a random actor's engine core for `stuck_s` (SIGCONT then, if it still exists: `_cont`)."""
        roles = self._roles()
        names = sorted(r for r in roles or {} if r.startswith("actor/"))
        if not names:
            return False
        name = self.rng.choice(names)
        actor, session = int(roles[name]["pid"]), _session(roles)
        cores = engine_cores(read_procs(), actor) if session is not None and alive_in(actor, session) else []
        if not cores:
            return False
        core = cores[0]
        if not self._signal(signal.SIGSTOP, {"kind": "stuck", "role": "actor", "name": f"{name} engine core",
                                             "pid": core.pid, "actor_pid": actor, "stuck_s": self.plan.stuck_s}, seen):
            return False
        self.stopped.append((time.monotonic() + self.plan.stuck_s, core.pid, core.start, len(self.faults) - 1))
        return True

    def _join(self, seen: int) -> bool:
        """SIGKILL a random actor, then SIGSTOP its successor's engine core for `join_stall_s` once its start has
        ended (`_hold`): the driver then rebuilds the weight-sync group with it, and the live engines wait in the
        rendezvous (`init_weight_transfer_engine`) for the stopped one past the progress deadline, with their
        requests in flight (review gpu_path_3 F1). The stop is a {"kind": "held", "of": index} line; `_cont`
        sends the SIGCONT."""
        roles = self._roles()
        names = sorted(r for r in roles or {} if r.startswith("actor/"))
        session = _session(roles or {})
        if not names or session is None:
            return False
        name = self.rng.choice(names)
        pid, before = int(roles[name]["pid"]), {int(v["pid"]) for k, v in roles.items() if k.startswith("actor/")}
        if not alive_in(pid, session):
            return False
        actor = int(name.split("/")[1])
        logs = actor_logs(self.run_dir, actor)
        built, joined = kv_lines(logs), self._joined(actor)
        if not self._signal(signal.SIGKILL, {"kind": "join", "role": "actor", "name": name, "pid": pid,
                                             "stall_s": self.plan.join_stall_s}, seen):
            return False
        index, until = len(self.faults) - 1, time.monotonic() + JOIN_HUNT_S
        while time.monotonic() < until and not self.done.wait(0.02):
            if kv_lines(logs) <= built:
                continue
            procs = read_procs()
            driver = find_driver(procs, self.run_dir)
            new = [a for a in (run_roles(procs, driver.pid)["actor"] if driver else []) if a not in before]
            cores = [(c, a) for a in new for c in engine_cores(procs, a)]
            if cores and self._hold(*cores[0], index, actor, joined):
                return True
        self._write({"kind": "held", "of": index, "missed": True, "epoch": round(time.time(), 3)})
        log(f"[chaos] join fault missed: no successor engine of {name} came up to hold in the join")
        return True

    def _hold(self, core, actor_pid: int, index: int, actor: int, joined: int) -> bool:
        """SIGSTOP the successor's engine core `core` as it enters the join: its engine is built (its KV-cache
        line, already seen), and it opens a file descriptor, the first since then (the join connects to the
        weight-sync group's store: weightsync.gloo.engine; the start's calls to the core, which come first,
        open none). When the console already says the successor joined (the rebuild won the race), the core
        is let go at once: "late"."""
        base = open_fds(core.pid)
        while True:
            if (now := open_fds(core.pid)) is None or base is None or self.done.is_set():
                return False
            if now > base:
                break
            time.sleep(HUNT_POLL_S)
        try:
            os.kill(core.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        late = self._joined(actor) > joined
        self.stopped.append((time.monotonic() + (0 if late else self.plan.join_stall_s), core.pid, core.start, index))
        self._write({"kind": "held", "of": index, "pid": core.pid, "actor_pid": actor_pid, "late": late,
                     "epoch": round(time.time(), 3)})
        log(f"[chaos] SIGSTOP: successor engine core pid {core.pid} (actor pid {actor_pid}) "
            + ("too late: it had joined already; SIGCONT now" if late else
               f"held in the weight-sync join for {self.plan.join_stall_s:.0f} s"))
        if late:
            self._cont()
        return True

    def _joined(self, actor: int) -> int:
        try:
            return joined_lines(self.log_path.read_text(errors="replace"), actor)
        except OSError:
            return 0

    def _cont(self, everything: bool = False) -> None:
        """SIGCONT the stopped engine cores that are due (`everything`: all), if they still exist."""
        for item in [s for s in self.stopped if everything or time.monotonic() >= s[0]]:
            self.stopped.remove(item)
            _, pid, start, index = item
            p = read_proc(pid)
            sent = p is not None and p.start == start and p.state != "Z"
            if sent:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            self._write({"kind": "cont", "of": index, "epoch": round(time.time(), 3), "sent": sent})
            log(f"[chaos] {'SIGCONT' if sent else 'no SIGCONT (gone)'}: engine core pid {pid}")

    # ------------------------------------------------------------------ helpers
    def _signal(self, sig: int, fault: dict, seen: int, after=None) -> bool:
        """Send `sig` to fault["pid"] and record the fault (with what `after()` finds right after)."""
        try:
            os.kill(fault["pid"], sig)
        except ProcessLookupError:
            return False
        fault |= after() if after else {}
        fault |= {"t_s": round(time.monotonic() - self.t0), "epoch": round(time.time(), 3), "steps_seen": seen}
        self.faults.append(fault)
        self._write(fault)
        log(f"[chaos] {fault['t_s']:5d} s: {signal.Signals(sig).name} {fault['name']} (pid {fault['pid']}, "
            f"{fault['kind']}) after {seen} progress lines")
        return True

    def _write(self, record: dict) -> None:
        with open(self.faults_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def _roles(self) -> dict | None:
        """processes.json of the run (rewritten by it after each restart); None before it exists."""
        try:
            return json.loads((self.run_dir / "processes.json").read_text())
        except (OSError, ValueError):
            return None

    def all_actors(self) -> bool:
        """Whether processes.json lists as many actors as it ever has (none is restarting)."""
        listed = sum(name.startswith("actor/") for name in self._roles() or {})
        self.most_actors = max(self.most_actors, listed)
        return listed == self.most_actors

    def _gap(self) -> float:
        return self.plan.every_s * self.rng.uniform(0.5, 1.5)


def _session(roles: dict) -> int | None:
    """The run's session: the driver's (launch.commands.supervisor starts the run in a session of its own)."""
    try:
        return os.getsid(int(roles["driver"]["pid"]))
    except (KeyError, ValueError, OSError):
        return None
