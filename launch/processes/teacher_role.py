"""`LiveTeacher`: the teacher's vLLM engine writing LUFFY's traces while the run goes on (`teacher.live_traces`).

Where it runs: in the driver's process, on a thread of its own with an `actors.host.EngineHost` loop (the engine
core is vLLM's subprocess, as an actor's is; on GPUs it sees only the GPUs the placement holds for it on the
driver's node, `devices`), so neither the learner nor the actors ever wait for it; the driver
takes what it finished once per step (`take`) and hands each trace on as a file trace is handed on
(`launch.loop.driver`: the buffer's demonstrations, the actors' prompts, `RunData.demos`).

What it does: one response, sampled as the rollouts are (rollout.temperature, top_p, top_k, max_response_tokens),
per queued training prompt
(missing: those without a file trace; all: every one), `IN_FLIGHT` requests at a time, scored with the run's
reward; kept, counted and appended to the run folder's trace file by `launch.prep.teacher_traces`.

Faults: an engine that cannot start or dies (a request raises, or a batch gets no answer within
rollout.deadlines.group_s, 120 s when that is auto or null) is shut down and replaced, like an actor, and the
prompts it had not finished go back to the front of the queue (nothing lost); after `MAX_RESTARTS` replacements
in a row without a finished trace it stops with one line and the run goes on with the traces it has. A teacher
that cannot load at all is refused before start (`launch.prep.preflight.check_teacher`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from launch.prep.teacher_traces import TRACE_FILE, TraceCounts, TraceFile, trace_record
from launch.processes.teacher_engine import MAX_RESTARTS, TeacherEngine, batch_deadline_s

IN_FLIGHT = 8  # teacher requests at once


class LiveTeacher:
    """The teacher's traces for `data` (`launch.prep.data.RunData`), written to `run_dir`/TRACE_FILE."""

    def __init__(self, cfg, teacher_dir: str | Path, data, run_dir: Path, log: Callable[[str], None] = print,
                 reward_fn=None, devices: str | None = None):
        from actors.engine import EngineSpec
        from actors.prompts import load_tokenizer

        self.cfg, self.data, self.log = cfg, data, log
        self.engine = TeacherEngine(EngineSpec.from_config(cfg, teacher_dir, actor_id=999, weight_transfer=False,
                                                           lora_rank=0, devices=devices), name="teacher")
        self.tokenizer = load_tokenizer(str(teacher_dir), cfg.model.trust_remote_code)
        self.items = {it.prompt_index: it for it in data.train}
        every = sorted(self.items)
        traced = data.teacher_traced  # kept by this run before it was stopped (a resume): never asked again
        self.todo: deque[int] = deque(i for i in every if i not in traced
                                      and (cfg.teacher.live_traces == "all" or i not in data.demos))
        self.counts = TraceCounts(from_file=len(data.demos) - len(traced), from_teacher=len(traced))
        self.file = TraceFile(run_dir / TRACE_FILE, log)
        self.restarts = 0
        self.deadline_s = batch_deadline_s(cfg)
        self._reward_fn = reward_fn
        self._ready: queue.Queue[tuple[int, np.ndarray, float]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-teacher", daemon=True)

    # -- the driver's side
    def start(self) -> None:
        self.log(f"[teacher] live traces ({self.cfg.teacher.live_traces}): {len(self.todo)} training prompts queued "
                 f"for the teacher at {self.engine.spec.model_dir}; kept traces go to {self.file.path}")
        self._thread.start()

    def take(self) -> dict[int, tuple[np.ndarray, float]]:
        """The traces kept since the last call: {prompt index: (token ids + eos, reward)}."""
        out = {}
        while True:
            try:
                i, ids, reward = self._ready.get_nowait()
            except queue.Empty:
                return out
            out[i] = (ids, reward)

    def metrics(self) -> dict:
        return self.counts.metrics() | {"demos/teacher_pending": len(self.todo), "demos/teacher_restarts": self.restarts}

    def close(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    # -- the teacher's thread
    def _run(self) -> None:
        from tasks.rewards import scorer_for

        scorer = scorer_for(self.cfg) if self._reward_fn is None else self._reward_fn
        failures = 0
        try:
            while self.todo and not self._stop.is_set():
                before = self.counts.from_teacher + self.counts.rejected
                try:
                    host = self.engine.live()
                    host.call(self._drain(host.engine, scorer))
                except Exception as e:  # noqa: BLE001 — any engine failure: replace it, like an actor's
                    self.engine.discard()
                    why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                    failures = 0 if self.counts.from_teacher + self.counts.rejected > before else failures + 1
                    if failures > MAX_RESTARTS or self._stop.is_set():
                        self.log(f"[teacher] the teacher's engine failed {failures} times in a row ({why}); no more "
                                 f"live traces this run ({len(self.todo)} prompts left without one) — see the "
                                 "teacher's log; the run goes on with the traces it has")
                        return
                    self.restarts += 1
                    self.log(f"[teacher] the teacher's engine died ({why}): replaced, {len(self.todo)} prompts "
                             "still queued (its unfinished ones re-queued)")
            if not self.todo:
                self.log(f"[teacher] live traces done: {self.counts.from_teacher} kept, {self.counts.rejected} "
                         f"rejected by the reward, {self.file.written} written to {self.file.path}")
        finally:
            self.engine.discard()
            if self._reward_fn is None:
                scorer.close()

    async def _drain(self, engine, scorer) -> None:
        """Generate until the queue is empty; on a failure the unfinished prompts go back to its front."""
        batch: list[int] = []
        try:
            while self.todo and not self._stop.is_set():
                batch = [self.todo.popleft() for _ in range(min(IN_FLIGHT, len(self.todo)))]
                try:
                    done = await asyncio.wait_for(asyncio.gather(*(self._trace(engine, i) for i in batch),
                                                                 return_exceptions=True), self.deadline_s)
                except TimeoutError:  # an engine that stopped answering (a dead one may never say so)
                    raise TimeoutError(f"no response to {len(batch)} requests in {self.deadline_s:g} s") from None
                failed = [i for i, d in zip(batch, done) if isinstance(d, BaseException)]
                for i, d in zip(batch, done):
                    if not isinstance(d, BaseException):
                        await asyncio.to_thread(self._keep, i, *d, scorer)
                batch = failed
                if failed:
                    raise next(d for d in done if isinstance(d, BaseException))
        finally:
            self.todo.extendleft(reversed(batch))  # unfinished (or failed) prompts first, in their order

    async def _trace(self, engine, i: int) -> tuple[list[int], str]:
        from actors.engine import one_response

        ids = await one_response(engine, self.items[i].prompt_ids, self.cfg.rollout,
                                 request_id=f"teacher-{i}-{time.monotonic_ns()}")
        return ids, self.tokenizer.decode(ids, skip_special_tokens=True)

    def _keep(self, i: int, ids: list[int], text: str, scorer) -> None:
        """Score one trace with the run's reward; count it; a kept one is appended and made ready."""
        from tasks.rewards import score_all

        rec = self.data.train_records[i]
        reward = score_all(scorer, [rec.question], [text], [rec.ground_truth],
                           [{**rec.extra_info, "data_source": rec.data_source}])[0]
        if not self.counts.count(reward, text):
            return
        eos = self.tokenizer.eos_token_id
        while ids and ids[-1] == eos:
            ids.pop()
        self.file.append(trace_record(rec, text))
        self._ready.put((i, np.asarray([*ids, eos], dtype=np.int32), float(reward)))
