"""`TeacherScorer`: the teacher's own vLLM engine scoring every trained row for `--algo opd` (`teacher.scoring:
engine`), so that the learner ranks never load the teacher.

Where it runs: in the driver's process, its engine on an `actors.host.EngineHost` thread (the engine core is
vLLM's subprocess, as an actor's and the live teacher's are; on GPUs it sees only the GPUs the placement holds
for it on the driver's node, `devices`), started with the actors so that its start-up overlaps theirs and the
learner's. What it does: `score(groups)` is called by the driver on each batch it pulled,
before the learner step; every sample of every group gets `Sample.teacher_logprobs` (float32 [T], what
`launch.processes.teacher_scores` says: log-softmax(logits / rollout.temperature) of each response token, exactly the
learner-side teacher's), which travels to the learner ranks with the groups and is read there by
`learner.providers.EngineTeacherLogprobs`.

Why here, on the pulled batch, rather than as groups arrive at the buffer: the buffer may still drop a stored group
as stale (a version moving past it) before it is served, and scoring the rows the learner trains, only those,
is what spends no teacher time on rows never trained; a step's rows are all known at the pull, so they go to the
engine at once (vLLM batches their prefills). The price is that scoring is not overlapped with the learner step:
it costs `time/teacher_score_s` of each step, one prefill per row (no sampling), against the learner-side
teacher's forward on the learner ranks, which it replaces.

Faults: the batch's scores are written to its rows only once every row has been scored, so a failure loses or
doubles nothing. An engine that dies (a request raises) or gives no answer within rollout.deadlines.group_s
(120 s when that is auto or null, the live teacher's rule) is shut down and replaced, with one console line, and
the whole batch is scored again; after `MAX_RESTARTS` replacements in a row the run stops with an error naming
the teacher (it cannot train this batch without its targets; `--resume` continues from the last checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from launch.processes.teacher_role import MAX_RESTARTS, batch_deadline_s


class TeacherScorer:
    """Scores the response tokens of pulled groups on the teacher of `teacher_dir` (module docstring)."""

    def __init__(self, cfg, teacher_dir: str | Path, log: Callable[[str], None] = print, devices: str | None = None):
        from actors.engine import EngineSpec
        from launch.processes.teacher_scores import TEMPERED_LOGITS

        self.log = log
        self.temperature = float(cfg.rollout.temperature)
        self.spec = EngineSpec.from_config(cfg, teacher_dir, actor_id=998, weight_transfer=False, lora_rank=0,
                                           devices=devices, extra={"worker_extension_cls": TEMPERED_LOGITS})
        self.deadline_s = batch_deadline_s(cfg)
        self.restarts = 0
        self.score_s = 0.0  # the last batch's scoring seconds (restarts included)
        self._host = None
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None

    def start(self) -> None:
        """Start the engine in the background (`score` waits for it)."""
        self.log(f"[teacher] scoring on its own vLLM engine (teacher.scoring=engine): {self.spec.model_dir}, at "
                 f"temperature {self.temperature:g}; the learner ranks do not load it")
        self._starting = threading.Thread(target=self._start_engine, name="teacher-scorer-start", daemon=True)
        self._starting.start()

    def score(self, groups: list) -> None:
        """Set `teacher_logprobs` on every sample of `groups`; replaces a dead engine and scores again."""
        t0 = time.monotonic()
        samples = [(g.prompt_tokens, s) for g in groups for s in g.samples]
        failures = 0
        while True:
            try:
                host = self._live_host()
                scores = host.call(self._score_all(host.engine, samples))
                break
            except Exception as e:  # noqa: BLE001 — any engine failure: replace it and score the batch again
                why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                failures += 1
                self._discard_host()
                if failures > MAX_RESTARTS:
                    raise RuntimeError(f"the teacher's scoring engine failed {failures} times in a row on one batch "
                                       f"({why}) — see the teacher's log above; check the teacher at "
                                       f"{self.spec.model_dir}, or score it on the learner ranks "
                                       "(teacher.scoring=learner)") from e
                self.restarts += 1
                self.log(f"[teacher] the teacher's scoring engine died ({why}): replaced, the batch's "
                         f"{len(samples)} rows scored again")
        for (_, sample), lp in zip(samples, scores):
            sample.teacher_logprobs = lp
        self.score_s = time.monotonic() - t0

    def metrics(self) -> dict:
        return {"time/teacher_score_s": self.score_s, "teacher/engine_restarts": self.restarts}

    def close(self) -> None:
        if self._starting is not None:
            self._starting.join(300)
        self._discard_host()

    # -- the engine
    def _start_engine(self) -> None:
        from actors.host import EngineHost

        host = EngineHost(self.spec, name="teacher-scorer")
        try:
            host.start()
            if self.temperature != 1.0:  # vLLM's prompt log-probs are untempered: divide the logits by T
                host.call(host.engine.collective_rpc("temper_logits", args=(self.temperature,)), timeout_s=60)
        except BaseException as e:  # noqa: BLE001 — handed to the driver by `_live_host`
            self._start_error = e
            with contextlib.suppress(Exception):
                host.close()
            return
        self._host = host

    def _live_host(self):
        """The running engine's host: the one starting in the background, else a new one (after a death)."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        elif self._host is None:
            self._start_engine()
        if self._start_error is not None:
            e, self._start_error = self._start_error, None
            raise e
        return self._host

    def _discard_host(self) -> None:
        host, self._host = self._host, None
        if host is not None:
            with contextlib.suppress(Exception):  # a dead engine may not shut down cleanly
                host.close()

    async def _score_all(self, engine, samples: list) -> list[np.ndarray]:
        from launch.processes.teacher_scores import score_row

        tag = time.monotonic_ns()
        jobs = [score_row(engine, prompt, s.tokens, request_id=f"teacher-score-{tag}-{i}")
                for i, (prompt, s) in enumerate(samples)]
        try:
            return await asyncio.wait_for(asyncio.gather(*jobs), self.deadline_s)
        except TimeoutError:  # an engine that stopped answering (a dead one may never say so)
            raise TimeoutError(f"no scores for {len(samples)} rows in {self.deadline_s:g} s") from None
