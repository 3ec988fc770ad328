"""`TeacherEngine`: a teacher's vLLM engine in the driver's process that is replaced when it fails, shared by the live
teacher (`launch.processes.teacher_role.LiveTeacher`) and the scorer (`launch.processes.teacher_scorer.TeacherScorer`).

One engine at a time, on an `actors.host.EngineHost` (its core is vLLM's subprocess): `start` builds it on a thread
of its own, so its start-up overlaps the run's; `live` hands it out, waiting for that start, or builds a new one
after `discard` (a failed start raises there, where its user counts failures); `discard` shuts a failed one down.
When a failure is one too many (`MAX_RESTARTS` in a row) is its user's rule, as is what it re-does.
`batch_deadline_s` is the wall budget both give one batch before they take the engine for dead.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

MAX_RESTARTS = 3  # engine replacements in a row (without progress) before a teacher gives up
DEADLINE_S = 120.0  # a batch's wall budget when rollout.deadlines.group_s is auto or null (auto's floor)


def batch_deadline_s(cfg) -> float:
    """A teacher engine's wall budget for one batch: rollout.deadlines.group_s, else DEADLINE_S."""
    group_s = cfg.rollout.deadlines.group_s
    return group_s if isinstance(group_s, float) else DEADLINE_S


class TeacherEngine:
    """The engine of `spec` (an `actors.engine.EngineSpec`); `ready(host)` runs on each new one once it has started
    (the scorer tempers its logits there)."""

    def __init__(self, spec, name: str, ready: Callable | None = None):
        self.spec, self.name, self._ready = spec, name, ready
        self.host = None  # the live engine's EngineHost, None before a start and after `discard`
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None

    def start(self) -> None:
        """Build the engine on a thread of its own (`live` waits for it)."""
        self._starting = threading.Thread(target=self._build, name=f"{self.name}-start", daemon=True)
        self._starting.start()

    def live(self):
        """The running engine's host: the one starting in the background, else a new one (after `discard`).
        Raises what a failed start raised."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        elif self.host is None:
            self._build()
        if self._start_error is not None:
            e, self._start_error = self._start_error, None
            raise e
        return self.host

    def discard(self) -> None:
        """Shut the engine down (a failed one may not shut down cleanly); the next `live` builds another."""
        host, self.host = self.host, None
        if host is not None:
            with contextlib.suppress(Exception):
                host.close()

    def close(self, timeout_s: float = 300.0) -> None:
        if self._starting is not None:
            self._starting.join(timeout_s)
        self.discard()

    def _build(self) -> None:
        from actors.host import EngineHost

        host = EngineHost(self.spec, name=self.name)
        try:
            host.start()
            if self._ready is not None:
                self._ready(host)
        except BaseException as e:  # noqa: BLE001 — raised to the user by `live`
            self._start_error = e
            with contextlib.suppress(Exception):
                host.close()
            return
        self.host = host
