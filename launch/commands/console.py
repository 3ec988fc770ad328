"""The console of a run (and of `algo-train eval`): which other programs' output is kept off it.

Other programs' console output that says nothing about the run (logging.verbose=false): Python
warnings of libraries (FutureWarning, DeprecationWarning, torch's note on read-only NumPy arrays),
transformers' warnings (e.g. "Token indices sequence length is longer than ...") and HF / tqdm
progress bars (weight loading, in every process). Set in the launching process's environment before
anything starts, so every process of the run inherits them: the supervised child, Ray's workers (a
local Ray is started by the child), vLLM's engine processes. A variable the user set is left as it is.

What Ray prints in the run's own process (the driver) goes to run_dir/logs/ray.log (`divert_ray_output`).
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import TextIO

from configs.schema import RunConfig

QUIET_ENV = {
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning,ignore:The given NumPy array is not writable",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
}


def quiet_env(cfg: RunConfig, starts_local_ray: bool, environ: dict[str, str]) -> dict[str, str]:
    """The variables to add to `environ` for the run's console (QUIET_ENV; {} with logging.verbose).
    A local Ray gets RAY_AUTH_MODE=token: what Ray 2.60 does for a new local cluster anyway, minus its
    warning that it did so (a cluster joined keeps the user's setting, docs/running.md)."""
    if cfg.logging.verbose:
        return {}
    add = dict(QUIET_ENV)
    if starts_local_ray:
        add["RAY_AUTH_MODE"] = "token"
    return {k: v for k, v in add.items() if k not in environ}


# What Ray itself prints in the driver's process: its messages from the cluster ("(raylet) A worker died or
# was killed ..."), a role's output forwarded before it reached its log file ("(ActorRole pid=12) ..."),
# both with an optionally coloured prefix, and the records of its "ray" logger ("Unhandled error ...").
RAY_OUTPUT = re.compile(r"(\x1b\[\d+m)?\((raylet|autoscaler|[^()]*pid=\d+[^()]*)\)"
                        r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\t[A-Z]+ \S+:\d+ -- ")


class RayToLog:
    """sys.stdout / sys.stderr of a run's driver: what Ray writes there (RAY_OUTPUT) goes to `log`, the
    rest to `console`. Why: a dead role is one line of ours on the console (launch.state.recovery,
    launch.commands.train); Ray's own account of it ("A worker died or was killed ...", its traceback blocks) is
    for the run's log folder. A line is Ray's when it starts so; print() writes a line's end in a call
    of its own, so each thread's unfinished line keeps its destination until its newline (a live
    progress line, never ended, does not hold back a Ray line)."""

    def __init__(self, console: TextIO, log: TextIO):
        self.console, self.log = console, log
        self._open = threading.local()  # .sink: where this thread's unfinished line goes (None at a line start)

    def write(self, text: str) -> int:
        if not text:
            return 0
        sink = self.log if RAY_OUTPUT.match(text) else getattr(self._open, "sink", None) or self.console
        self._open.sink = None if text.endswith("\n") else sink
        return sink.write(text)

    def flush(self) -> None:
        self.log.flush()
        self.console.flush()

    def __getattr__(self, name):  # isatty, fileno, encoding ...: the console's
        return getattr(self.console, name)


def divert_ray_output(log_path: Path) -> None:
    """Send what Ray prints in this process to `log_path` (appended), from now on (`RayToLog`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open while the process prints
    sys.stdout, sys.stderr = RayToLog(sys.stdout, log), RayToLog(sys.stderr, log)
