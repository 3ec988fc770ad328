"""Where a running `algo-train`'s CPU goes: CPU seconds per training step by role, between two steps.

`CpuWindow` watches a run folder's `metrics.jsonl` from a thread. When the run has written `first`
training rows it reads every process's CPU time (utime + stime, /proc/<pid>/stat) and again at `last`;
the difference, divided by the steps in between, is each role's CPU seconds a step. A process started
inside the window counts from zero, one that ended inside it is missing (both rare in a steady state).
Roles are told by process title or command line (`ROLES`, first match); everything else on the machine
is "other" (Ray's own daemons, the benchmark, other jobs). Linux only.

On a machine whose speed drifts with other jobs, CPU seconds per step of two runs compare the work each
layout does only roughly (a slower host inflates both), but within one run the split between roles is
exact, and a role whose CPU a step halves did half the work.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

ROLES = (("engine", "VLLM::EngineCore"), ("learner", "ray::LearnerRank"), ("actor", "ray::ActorRole"),
         ("buffer", "multiprocessing.spawn"), ("driver", "launch.commands.supervisor"))


def role_of(cmdline: str) -> str:
    """The role of a process from its title / command line (NUL-separated as /proc gives it)."""
    return next((role for role, mark in ROLES if mark in cmdline), "other")


def cpu_seconds(pid: int | str) -> float:
    """user + system CPU seconds of a live process (Linux /proc; OSError once it is gone)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_pid() -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) of every process now running."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out[int(name)] = (role_of(cmd), cpu_seconds(name))
        except OSError:
            continue
    return out


def per_step(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], steps: int) -> dict[str, float]:
    """CPU seconds a step by role between two `cpu_by_pid` readings `steps` training steps apart."""
    total: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        total[role] = total.get(role, 0.0) + cpu - before.get(pid, (role, 0.0))[1]
    return {role: round(cpu / steps, 3) for role, cpu in sorted(total.items())}


def training_rows_written(metrics: Path) -> int:
    try:
        return metrics.read_text().count('"time/train_s"')
    except OSError:
        return 0


class CpuWindow(threading.Thread):
    """Reads the CPU split of the run writing `run_dir` between its `first`-th and `last`-th training row.
    `result` holds {"steps", "wall_s", "cores_busy", "cpu_s_per_step": {role: s}} once the run has passed
    `last` (empty if it never did); `stop()` ends the watch early."""

    def __init__(self, run_dir: Path, first: int, last: int, poll_s: float = 0.25):
        super().__init__(daemon=True, name="cpu-window")
        self.metrics, self.first, self.last, self.poll_s = Path(run_dir) / "metrics.jsonl", first, last, poll_s
        self.result: dict = {}
        self._halt = threading.Event()

    def _wait_for(self, rows: int) -> bool:
        while not self._halt.is_set():
            if training_rows_written(self.metrics) >= rows:
                return True
            time.sleep(self.poll_s)
        return False

    def run(self) -> None:
        if not self._wait_for(self.first):
            return
        before, t0 = cpu_by_pid(), time.monotonic()
        if not self._wait_for(self.last):
            return
        after, wall = cpu_by_pid(), time.monotonic() - t0
        steps = self.last - self.first
        split = per_step(before, after, steps)
        self.result = {"steps": steps, "wall_s": round(wall, 1),
                       "cores_busy": round(sum(split.values()) * steps / wall, 2), "cpu_s_per_step": split}

    def stop(self) -> None:
        self._halt.set()
