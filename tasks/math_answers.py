"""Math answer checking with `math-verify`, under a hard per-call time limit.

Why a child process: math-verify bounds its own work with `signal.alarm`, which (checked with
math-verify 0.9.0) raises "signal only works in main thread" when called from any other thread -- where
actors score rewards -- and cannot interrupt a long call into C (a regex, a big-integer power). So
`MathVerifier` keeps one long-lived worker process (`tasks.worker`, JSON lines over pipes, running
`tasks.math_worker.equivalent`) and kills and restarts it when a call exceeds its limit; that call
scores 0. It works from any thread (calls are serialised by a lock). Measured cost: see tasks/MATH500_CHECK.md.

Answer extraction is ours (`tasks.boxed.last_boxed`: the last ``\\boxed{}``); math-verify then compares
``\\boxed{prediction}`` with ``\\boxed{ground truth}`` (the gold wrapping PACS uses, REFERENCE_NOTES
§6.1). A response without a boxed answer scores 0.
"""

from __future__ import annotations

import atexit
import threading

from tasks.boxed import last_boxed
from tasks.worker import FunctionWorker, WorkerError, WorkerTimeout


class MathVerifier:
    """Equivalence of two LaTeX answers by math-verify (`tasks.math_worker.equivalent`) in a killable
    worker process (`tasks.worker.FunctionWorker`).

    timeout_s: limit of one `equivalent` call (default 5 s). startup_timeout_s: limit for a (re)started
    worker to import math-verify, not counted in the per-call limit.
    """

    def __init__(self, timeout_s: float = 5.0, startup_timeout_s: float = 120.0) -> None:
        self._worker = FunctionWorker("tasks.math_worker:equivalent", timeout_s, startup_timeout_s)

    @property
    def timeouts(self) -> int:
        """Calls that ran past their limit so far."""
        return self._worker.timeouts

    def equivalent(self, pred: str, gold: str, timeout_s: float | None = None) -> bool:
        """True iff math-verify finds answer `pred` equal to `gold`; False on timeout (counted in
        `self.timeouts`), when the worker died, or when either does not parse."""
        try:
            return bool(self._worker.call(pred, gold, timeout_s=timeout_s))
        except (WorkerTimeout, WorkerError):
            return False

    def close(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        self._worker.close()


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
