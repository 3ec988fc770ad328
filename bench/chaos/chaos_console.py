"""What the chaos bench reads from the run's console (bench/chaos/chaos.py): when each learner step finished, and
which restarts the run made, with the time each took as its own line says.

Step times: `metrics.jsonl` rows carry no wall clock (`time/wall_s` counts from the start of the training loop
of one run process, which a learner restart starts again, and a resume removes the rows of the steps it trains
again), so the times come from the plain progress lines, one per step, "HH:MM:SS step k/N ..." in local time
(`launch.loop.progress`): each is placed on the calendar by the run's start (epoch seconds, recorded by the
bench), a line earlier in the day than the one before it being on the next day. One-second resolution.

Restart lines, in the forms the run has printed (`launch.state.recovery`, `launch.commands.train`):
  - actor, one line (before issue 33): "[actor] actor i (pid P ...) died (...); restarted as pid Q and
    re-synced to version V in Ns; ..."
  - actor, two lines (restarts in the background): "[actor] actor i (pid P ...) died (...); its successor
    starts in the background ...", then once it is up "[actor] actor i restarted as pid Q and joined at
    version V in Ns ..." (also read: "... joined ..., Ns after its death"); a successor that is up answers
    every death of its actor not yet answered, and its time belongs to the last of them (the driver times
    a successor from the death it replaced last);
  - buffer: "[buffer] the buffer process (pid P ...) died (...); restarted as pid Q in Ns: ...";
  - learner: "[learner] learner rank r (pid P ...) died (...); restart k of N: resuming ..." (no time; pid 0
    when the line names no process).
A death line that no restart answers (the run stopped) is no restart.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

STEP_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d) step (\d+)/(\d+) ", re.M)  # a plain progress line: one per step
ACTOR_DEATH = re.compile(r"^\[actor\] actor (\d+) \(pid (\d+)\b.*\bdied\b")
ACTOR_BACK = re.compile(r"^\[actor\] actor (\d+) (?!\(pid).*?(?:restarted as pid|joined)")
BUFFER_BACK = re.compile(r"^\[buffer\] the buffer process \(pid (\d+)\b.*; restarted as pid")
LEARNER_BACK = re.compile(r"^\[learner\] (?:.*?\(pid (\d+)\b.*?)?restart \d+ of \d+: resuming")
SECONDS = re.compile(r"\bin (\d+(?:\.\d+)?)s\b|\b(\d+(?:\.\d+)?) ?s after\b")
DAY_S = 86400.0
BACKWARDS_S = 3600.0  # a progress line this much before the previous one is on the next day


@dataclass(frozen=True)
class Restart:
    role: str  # actor, buffer or learner
    pid: int  # the process that died (0: the line names none)
    seconds: float | None  # what the run's line says the restart took (None: it says nothing)


def progress(console: str) -> tuple[int, int, int]:
    """(progress lines so far, the last one's step, the steps asked); zeros before the first."""
    lines = STEP_LINE.findall(console)
    return (len(lines), int(lines[-1][3]), int(lines[-1][4])) if lines else (0, 0, 0)


def step_times(console: str, start_epoch: float) -> list[float]:
    """Epoch seconds of every progress line, in console order (module docstring): the clock times read
    in the local time zone of the run's start, `start_epoch`."""
    lt = time.localtime(start_epoch)
    midnight = start_epoch - (lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + start_epoch % 1)
    out: list[float] = []
    ref, day = start_epoch, 0.0
    for h, m, s, _, _ in STEP_LINE.findall(console):
        t = midnight + day + int(h) * 3600 + int(m) * 60 + int(s)
        while t < ref - BACKWARDS_S:
            day += DAY_S
            t += DAY_S
        out.append(t)
        ref = t
    return out


def _seconds(line: str) -> float | None:
    m = SECONDS.search(line)
    return float(m[1] or m[2]) if m else None


def restart_events(console: str) -> list[Restart]:
    """Every restart the run's console reports, in the order it reported them (module docstring)."""
    out: list[Restart] = []
    waiting: dict[int, list[int]] = {}  # actor -> pids of its deaths no successor has answered yet
    for line in console.splitlines():
        if m := ACTOR_DEATH.match(line):
            if "restarted as pid" in line:  # the one-line form
                out.append(Restart("actor", int(m[2]), _seconds(line)))
            else:
                waiting.setdefault(int(m[1]), []).append(int(m[2]))
        elif m := ACTOR_BACK.match(line):
            dead = waiting.pop(int(m[1]), [])
            out += [Restart("actor", pid, _seconds(line) if k == len(dead) - 1 else None) for k, pid in enumerate(dead)]
        elif m := BUFFER_BACK.match(line):
            out.append(Restart("buffer", int(m[1]), _seconds(line)))
        elif m := LEARNER_BACK.match(line):
            out.append(Restart("learner", int(m[1] or 0), None))
    return out


def restarts(console: str) -> dict[str, list[int]]:
    """Per role, the pids the run's console lines say died and were restarted (0 when a line names none)."""
    out: dict[str, list[int]] = {"actor": [], "buffer": [], "learner": []}
    for r in restart_events(console):
        out[r.role].append(r.pid)
    return out
