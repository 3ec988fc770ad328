"""A live teacher's traces for LUFFY (`teacher.live_traces`): which are kept, where they are written, what is counted.

- Kept: a trace is the teacher's response to a training prompt, scored with the run's reward exactly as a file
  trace is (`launch.prep.data.score_demos`: decoded with special tokens skipped, against the prompt's question,
  ground truth and extra). Only a non-empty trace scoring ≥ 1 is used (`accepted`); the others are counted as rejected
  and the prompt keeps what it had (its file trace, or none).
- Written: each kept trace is appended as one JSON line in the veRL layout `data.demos` reads (`tasks.records`),
  the training prompt's record with the trace as its target, to `TRACE_FILE` in the run folder; a later run
  passes that file as `--demos` and reads it offline. The file is flushed after every line, so a run that
  stops keeps every trace it accepted.
- A trace file that cannot be written (disk full, permissions, a directory in its place) is said in one line,
  once; the run goes on and keeps using the traces it accepts (they reach LUFFY's demonstration path all the
  same), but they are no longer saved: losing the file costs a later run its offline traces, never this run
  its training, so stopping it would be the worse choice.
- Counted (`TraceCounts.metrics`, one row per step, cumulative): `demos/from_file`, `demos/from_teacher`,
  `demos/rejected` (docs/metrics.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tasks.records import Record

TRACE_FILE = "teacher_traces.jsonl"


def accepted(reward: float, trace: str) -> bool:
    """Whether a teacher trace is used: only a correct one (reward ≥ 1) with some text (an empty trace, e.g. an
    immediate eos, is no demonstration, and `data.demos` refuses empty targets)."""
    return reward >= 1.0 and bool(trace.strip())


def trace_record(prompt: Record, trace: str) -> Record:
    """The training prompt's record with the teacher's `trace` as its target (what `data.demos` holds)."""
    return replace(prompt, target=trace, extra_info={**prompt.extra_info, "teacher_trace": True})


@dataclass
class TraceCounts:
    """Traces from the file, kept from the teacher, and rejected by the reward (cumulative over the run)."""

    from_file: int = 0
    from_teacher: int = 0
    rejected: int = 0

    def count(self, reward: float, trace: str) -> bool:
        """Count one teacher trace by its reward and text; True when it is kept (`accepted`)."""
        ok = accepted(reward, trace)
        if ok:
            self.from_teacher += 1
        else:
            self.rejected += 1
        return ok

    def metrics(self) -> dict[str, int]:
        return {"demos/from_file": self.from_file, "demos/from_teacher": self.from_teacher,
                "demos/rejected": self.rejected}


class TraceFile:
    """Appends kept traces to `path`, one JSON line each (module docstring); `log` gets the one line said when
    the file cannot be written, after which appends are skipped."""

    def __init__(self, path: str | Path, log: Callable[[str], None] = print):
        self.path, self.log = Path(path), log
        self.written = 0
        self.broken: str | None = None  # why the file cannot be written, once it cannot

    def append(self, record: Record) -> bool:
        """Append one record; False when the file cannot be written (said once, the run goes on)."""
        if self.broken is not None:
            return False
        try:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record.to_row()) + "\n")
                f.flush()
        except OSError as e:
            self.broken = e.strerror or str(e)
            self.log(f"[teacher] cannot write the trace file {self.path} ({self.broken}): the teacher's traces are "
                     f"still trained on in this run but not saved from now on ({self.written} saved) — free space "
                     "or fix the folder's permissions before the next run that should read them offline")
            return False
        self.written += 1
        return True
