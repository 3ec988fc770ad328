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
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from launch.processes.teacher_engine import MAX_RESTARTS, TeacherEngine, batch_deadline_s


class TeacherScorer:
    """Scores the response tokens of pulled groups on the teacher of `teacher_dir` (module docstring)."""

    def __init__(self, cfg, teacher_dir: str | Path, log: Callable[[str], None] = print, devices: str | None = None):
        from actors.engine import EngineSpec
        from launch.processes.teacher_scores import TEMPERED_LOGITS

        self.log = log
        self.temperature = float(cfg.rollout.temperature)
        self.spec = EngineSpec.from_config(cfg, teacher_dir, actor_id=998, weight_transfer=False, lora_rank=0,
                                           devices=devices, extra={"worker_extension_cls": TEMPERED_LOGITS})
        self.engine = TeacherEngine(self.spec, name="teacher-scorer", ready=self._temper)
        self.deadline_s = batch_deadline_s(cfg)
        self.restarts = 0
        self.score_s = 0.0  # the last batch's scoring seconds (restarts included)

    def start(self) -> None:
        """Start the engine in the background (`score` waits for it)."""
        self.log(f"[teacher] scoring on its own vLLM engine (teacher.scoring=engine): {self.spec.model_dir}, at "
                 f"temperature {self.temperature:g}; the learner ranks do not load it")
        self.engine.start()

    def score(self, groups: list) -> None:
        """Set `teacher_logprobs` on every sample of `groups`; replaces a dead engine and scores again."""
        t0 = time.monotonic()
        samples = [(g.prompt_tokens, s) for g in groups for s in g.samples]
        failures = 0
        while True:
            try:
                host = self.engine.live()
                scores = host.call(self._score_all(host.engine, samples))
                break
            except Exception as e:  # noqa: BLE001 — any engine failure: replace it and score the batch again
                why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                failures += 1
                self.engine.discard()
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
        self.engine.close()

    def _temper(self, host) -> None:
        """vLLM's prompt log-probs are untempered: a new engine's logits are divided by T (at T ≠ 1)."""
        if self.temperature != 1.0:
            host.call(host.engine.collective_rpc("temper_logits", args=(self.temperature,)), timeout_s=60)

    async def _score_all(self, engine, samples: list) -> list[np.ndarray]:
        from launch.processes.teacher_scores import score_row

        tag = time.monotonic_ns()
        jobs = [score_row(engine, prompt, s.tokens, request_id=f"teacher-score-{tag}-{i}")
                for i, (prompt, s) in enumerate(samples)]
        try:
            return await asyncio.wait_for(asyncio.gather(*jobs), self.deadline_s)
        except TimeoutError:  # an engine that stopped answering (a dead one may never say so)
            raise TimeoutError(f"no scores for {len(samples)} rows in {self.deadline_s:g} s") from None
