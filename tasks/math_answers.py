"""Math answer checking with `math-verify`, under a hard per-call time limit.

Why a child process: math-verify bounds its own work with `signal.alarm`, which (checked with
math-verify 0.9.0) raises "signal only works in main thread" when called from any other thread -- where
actors score rewards -- and cannot interrupt a long call into C (a regex, a big-integer power). So
`MathVerifier` keeps one long-lived worker process (`tasks/math_worker.py`, JSON lines over pipes) and
kills and restarts it when a call exceeds its limit; that call scores 0. It works from any thread
(calls are serialised by a lock). Measured cost: see tasks/MATH500_CHECK.md.

Answer extraction is ours (`tasks.boxed.last_boxed`: the last ``\\boxed{}``); math-verify then compares
``\\boxed{prediction}`` with ``\\boxed{ground truth}`` (the gold wrapping PACS uses, REFERENCE_NOTES
§6.1). A response without a boxed answer scores 0.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from tasks.boxed import last_boxed

_WORKER = Path(__file__).with_name("math_worker.py")


class MathVerifier:
    """Equivalence of two LaTeX answers by math-verify in a killable worker process.

    timeout_s: limit of one `equivalent` call (default 5 s). startup_timeout_s: limit for a (re)started
    worker to import math-verify, not counted in the per-call limit.
    """

    def __init__(self, timeout_s: float = 5.0, startup_timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.timeouts = 0
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self._lock = threading.Lock()

    def equivalent(self, pred: str, gold: str, timeout_s: float | None = None) -> bool:
        """True iff math-verify finds answer `pred` equal to `gold`; False on timeout (counted in
        `self.timeouts`) or when either does not parse."""
        request = json.dumps({"pred": pred, "gold": gold}).encode() + b"\n"
        with self._lock:
            proc = self._worker()
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                reply = self._read_line(proc, timeout_s or self.timeout_s)
            except OSError:  # the worker died (BrokenPipeError)
                reply = None
            if reply is None:
                self.timeouts += 1
                self._kill()
                self._start()  # warm up the replacement in the background
                return False
            return bool(json.loads(reply)["ok"])

    def close(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        with self._lock:
            self._kill()

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, str(_WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        self._ready = False

    def _worker(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        if not self._ready:
            if self._read_line(self._proc, self.startup_timeout_s) is None:
                self._kill()
                raise RuntimeError(
                    f"math-verify worker {_WORKER} did not start in {self.startup_timeout_s} s"
                )
            self._ready = True
        return self._proc

    @staticmethod
    def _read_line(proc: subprocess.Popen, timeout_s: float) -> bytes | None:
        """One line from the worker, or None if none arrives within `timeout_s` (or it died)."""
        deadline = time.monotonic() + timeout_s
        fd = proc.stdout.fileno()
        chunks = b""
        while not chunks.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            chunks += chunk
        return chunks

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        self._ready = False


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> MathVerifier:
    """The process-wide verifier `math_reward` uses (started on first use, stopped at exit)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
            atexit.register(_default.close)
        return _default


def math_reward(response: str, ground_truth: str, timeout_s: float | None = None) -> float:
    """1.0 if the last ``\\boxed{}`` of `response` equals `ground_truth` by math-verify, else 0.0."""
    pred = last_boxed(response)
    if pred is None or not pred.strip():
        return 0.0
    return float(default_verifier().equivalent(pred, ground_truth, timeout_s))
