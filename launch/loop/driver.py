"""The driver's training loop: pull a batch → learner step → weight push → new version, with
evaluation, metrics, checkpoints, actor health, the prompt ledger and a clean Ctrl-C.

No idle learner: the push of version v is started (weights gathered in the serving dtype) and left
travelling while the loop pulls and trains the batch of version v + 1; it is waited for just before
the push of v + 1 starts, before an evaluation (which must see version v) and at the end. At most one
push is in flight, so an actor is never more than one version behind the learner's pushes, and the
buffer's staleness accounting (which counts from the learner's version) is unchanged.

With `buffer.max_staleness_auto` the driver feeds each step's wait and busy time to
`launch.loop.staleness_auto.AutoStaleness` and sends the bound it chooses with the next `set_version`; the
buffer enforces it and reports it back (`buffer/max_staleness`).

Dead actors and a dead buffer process are restarted where the run is (`launch.state.recovery`); the run's
position (learner steps = the weight version, and the prompt ledger) is `launch.state.position`, and its
checkpoints save and resume it with the learner and the buffer (`launch.state.run_checkpoints`).

Ctrl-C (or SIGTERM): actors stop starting prompts and drain what is in flight into the buffer, the
buffer is snapshotted, a checkpoint is written, and every process is shut down — `--resume RUN_DIR`
then continues with no prompt skipped or trained twice (the ledger proves it).
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import algos
from buffer.records import Key
from configs.schema import RunConfig
from launch.loop.metrics import (
    LoopClock,
    MetricsWriter,
    StepTimes,
    done_line,
    merge_rows,
    run_summary,
    save_eval_prompts,
    step_row,
    wandb_init,
)
from launch.loop.progress import Progress
from launch.loop.samples import SampleLog
from launch.loop.staleness_auto import AutoStaleness
from launch.prep.data import RunData
from launch.prep.demo_batches import DemoBatches
from launch.processes.process_graph import ProcessGraph
from launch.state.buffer_keeper import BufferKeeper
from launch.state.position import RunPosition
from launch.state.recovery import Recovery
from launch.state.run_checkpoints import RunCheckpoints
from tasks.rewards import first_error

PULL_POLL_S = 5.0  # how often a driver waiting for a batch checks the learner ranks' and actors' health


class Stop(Exception):
    """Raised inside the loop when the user asked the run to stop."""


@dataclass
class Outputs:
    """Where each row goes: metrics.jsonl (with TensorBoard and W&B), the sample log and the console."""
    metrics: MetricsWriter
    samples: SampleLog
    progress: Progress
    log_every: int

    def write(self, step: int, groups: list, row: dict) -> None:
        self.metrics.write(step, row)
        self.samples.write(step, groups)
        self.progress.update(step, row, every=self.log_every)


class Driver:
    def __init__(self, cfg: RunConfig, graph: ProcessGraph, data: RunData, run_dir: Path, buffer_address: str,
                 progress: Progress, secrets=None, keeper: BufferKeeper | None = None):
        """keeper: owns the buffer process at `buffer_address` and restarts it when it dies (None: the
        buffer is someone else's, e.g. a test's, and a dead one ends the run). secrets: `.public()`."""
        self.cfg, self.graph, self.data, self.run_dir, self.progress = cfg, graph, data, run_dir, progress
        self.keeper = keeper
        self.position = RunPosition()
        self.recovery = Recovery(graph, self.position, progress, run_dir, buffer_address, data=data,
                                 secrets=secrets, keeper=keeper)
        prompts = {it.prompt_index: it.prompt_ids for it in data.train}
        self.demos = DemoBatches(data.demos, prompts, cfg.learner.batch_prompts, cfg.seed) \
            if algos.get(cfg.algo).trains_on_demonstrations_only else None
        self.checkpoints = RunCheckpoints(run_dir, graph, self.recovery, self.position, progress,
                                          cfg.learner.keep_checkpoints, keeper)
        self.auto = AutoStaleness(cfg.buffer.max_staleness, cfg.buffer.max_staleness_cap) \
            if cfg.buffer.max_staleness_auto else None
        self._stop_requested = False
        self._reward_error_shown = False
        self.teacher = None  # a `launch.processes.teacher_role.LiveTeacher` (teacher.live_traces), set by run_graph
        self.scorer = None  # a `launch.processes.teacher_scorer.TeacherScorer` (teacher.scoring: engine), set by run_graph

    @property
    def version(self) -> int:
        return self.position.version

    @property
    def client(self):
        """The driver's buffer client (a new one after a buffer restart: `launch.state.recovery`)."""
        return self.recovery.client

    def write_processes(self) -> None:
        """run_dir/processes.json: where the run's processes are (`Recovery.write_processes`)."""
        self.recovery.write_processes()

    def restore(self, resume_dir: Path) -> list[Key]:
        """Resume from the latest checkpoint of `resume_dir`; the prompts the actors must skip
        (`launch.state.run_checkpoints`)."""
        skip = self.checkpoints.restore(resume_dir)
        if self.auto is not None:  # the bound chosen before the stop, as the restored buffer holds it
            self.auto.resume(self.recovery.client.stats()["max_staleness"])
        return skip

    # ------------------------------------------------------------------ the steps of the loop
    def _pull(self) -> tuple[list, float]:
        """The next batch (the buffer's, or the demonstrations' for SFT) and the seconds waited for it."""
        if self.demos is not None:
            return self.demos.next(), 0.0
        t0 = time.monotonic()
        n = self.cfg.learner.batch_prompts
        while True:
            if self._stop_requested:
                raise Stop
            try:
                groups = self.recovery.call_on_live_buffer(lambda c: c.pull_batch(n, timeout_s=PULL_POLL_S))
            except TimeoutError:  # no batch yet: is everyone who could feed or take it alive? a successor up?
                self.graph.check_learner()
                # a push that failed left every engine without a version, so no batch comes until it is
                # settled (its actor replaced, the others re-synced): starved, wait for the push here
                self.recovery.settle_push()
                self.recovery.check_actors()
                self.recovery.admit_successors()
                continue
            self.position.ledger.discard(self.client.last_pull["discarded"])  # settled by the buffer, not trained
            return groups, time.monotonic() - t0

    def _hand_on_traces(self) -> None:
        """The live teacher's traces kept since the last step go where a file's go: the run's demonstrations
        (a restarted buffer is given them again), the buffer, every actor's prompts."""
        if self.teacher is None or not (kept := self.teacher.take()):
            return
        demos = {i: ids for i, (ids, _) in kept.items()}
        self.data.demos.update(demos)
        self.data.demo_rewards.update({i: r for i, (_, r) in kept.items()})
        self.recovery.call_on_live_buffer(lambda c: c.add_demos(demos, rewards={i: r for i, (_, r) in kept.items()}))
        if self.graph.actors:
            self.graph.set_demos(demos)

    def _train(self, groups: list) -> tuple[dict, float]:
        """One learner step on `groups`, recorded in the ledger: (the learner's metrics, seconds waited)."""
        self.position.ledger.record(self.position.step, [g.key for g in groups])
        t0 = time.monotonic()
        metrics = self.graph.step(groups, self.version)
        self.position.step += 1
        return metrics, time.monotonic() - t0

    def _sync_weights(self) -> dict:
        """Settle the previous push, then start pushing the current version (unless a restart or a successor
        joining just did); returns the stats of the last push settled since the previous call (an evaluation
        settles too)."""
        if self.recovery.settle_push() is not None and self.graph.actors and not self.recovery.admit_successors():
            self.graph.start_push(self.version)
        stats, self.recovery.unreported_push = self.recovery.unreported_push, {}
        return stats

    def _publish(self) -> tuple[dict, float, dict]:
        """Publish the new version: to the actors (`_sync_weights`) and to the buffer (its staleness
        clock). Returns (the settled push's stats, seconds of weight sync, the buffer's stats)."""
        t0 = time.monotonic()
        sync = self._sync_weights()  # the previous version's push, which overlapped this step
        sync_s = time.monotonic() - t0
        k = self.auto.k if self.auto is not None else None  # a raised bound rides along (max_staleness: auto)
        buffer = self.recovery.call_on_live_buffer(lambda c: c.set_version(self.version, k))  # with its stats
        return sync, sync_s, buffer

    def _driver_row(self, groups: list, times: StepTimes, sync: dict, buffer: dict) -> dict:
        buffer = self.keeper.monotonic(buffer) if self.keeper is not None else buffer  # across restarts
        row = step_row(groups, times, sync, buffer, version=self.version, actor_restarts=self.graph.restarts,
                       buffer_restarts=self.keeper.restarts if self.keeper is not None else 0,
                       actor_reports=self.recovery.reports.values())  # as of the last health check
        return row | {"buffer/max_staleness": buffer.get("max_staleness")}  # the bound it enforces from now on

    def _retune(self, times: StepTimes, evaluated: bool) -> None:
        """max_staleness: auto: one step's times to the chooser, its decision on the console."""
        if self.auto is None:
            return
        if line := self.auto.observe(self.position.step, times.wait_s, times.since_last_s - times.wait_s):
            self.progress.message(line)
        if evaluated:
            self.auto.restart()

    def _cadence(self) -> dict:
        """What falls due after this step: an evaluation (its keys are returned), then a checkpoint (with
        an HF export when due), or else the buffer's timer snapshot."""
        lc, step = self.cfg.learner, self.position.step
        row = self.evaluate() if lc.eval_every and step % lc.eval_every == 0 else {}
        export = bool(lc.hf_every) and step % lc.hf_every == 0
        if export or (lc.save_every and step % lc.save_every == 0):
            self.checkpoints.save(export=export)
        elif self.keeper is not None:
            self.recovery.call_on_live_buffer(self.keeper.maybe_snapshot)
        return row

    def _show_reward_error(self) -> None:
        """The first failed reward call any actor reported, once per run."""
        if not self._reward_error_shown and (err := first_error(self.recovery.reports.values())):
            self._reward_error_shown = True
            self.progress.message(f"[reward] a reward call failed and scored 0 (counted in reward/errors; "
                                  f"shown once): {err}")

    def evaluate(self) -> dict:
        """Held-out accuracy of the current version (the push in flight is settled first); each prompt's reward
        is appended to eval_prompts.jsonl (`save_eval_prompts`)."""
        if not self.data.eval or not self.graph.actors:
            return {}
        self.recovery.settle_push()
        self.recovery.await_successors(PULL_POLL_S, until_live=True)  # every actor died: wait for one
        t0 = time.monotonic()
        try:
            result = self.graph.evaluate(self.data.eval)
        except Exception:
            if not self.recovery.check_actors():  # not a dead actor's fault
                raise
            result = self.graph.evaluate(self.data.eval)
        save_eval_prompts(self.run_dir, self.position.step, result["per_prompt"])
        tools = {"eval/tool_share": result["tool_share"]} if "tool_share" in result else {}
        return {"eval/accuracy": result["accuracy"], "eval/n": result["n"], **tools, "time/eval_s": time.monotonic() - t0}

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        """Train to `learner.steps` (or a Ctrl-C: status 130), then drain, evaluate, checkpoint, summarise."""
        outputs, status = self._open_outputs(), 0
        with self._stop_on_signals():
            try:
                self._evaluate_before_training(outputs.metrics)
                self.graph.start_rollouts()
                clock = LoopClock()
                while self.position.step < self.cfg.learner.steps:
                    self._hand_on_traces()
                    groups, wait_s = self._pull()
                    if self.scorer is not None:  # the teacher's log-probs of every row, before the learner step
                        self.scorer.score(groups)
                    learned, train_s = self._train(groups)
                    sync, sync_s, buffer = self._publish()
                    times = clock.lap(wait_s=wait_s, train_s=train_s, sync_s=sync_s)
                    driven = self._driver_row(groups, times, sync, buffer)
                    for teacher in (self.teacher, self.scorer):
                        driven |= teacher.metrics() if teacher is not None else {}
                    self._show_reward_error()
                    row = merge_rows(learner=learned, driver=driven, evaluation=(evaluated := self._cadence()))
                    self._retune(times, bool(evaluated))
                    outputs.write(self.position.step, groups, row)
                    self.recovery.check_actors_if_due()
                    self.recovery.follow_scale_requests()  # `algo-train scale RUN_DIR --actors N`
            except Stop:
                status = 130
        return self._finish(outputs, status)

    def _open_outputs(self) -> Outputs:
        cfg, step = self.cfg, self.position.step
        metrics = MetricsWriter(self.run_dir, tensorboard=cfg.logging.tensorboard, from_step=step,
                                wandb=wandb_init(cfg, self.run_dir))
        samples = SampleLog(self.run_dir, cfg.logging.samples_every, cfg.logging.samples_per_step,
                            self.graph.model_dir, text_sink=metrics.write_text, from_step=step,
                            trust_remote_code=cfg.model.trust_remote_code)
        return Outputs(metrics, samples, self.progress, cfg.logging.log_every)

    @contextmanager
    def _stop_on_signals(self):
        """Ctrl-C and SIGTERM ask the loop to stop after the current step; a second Ctrl-C aborts."""
        def on_signal(signum, frame):
            if self._stop_requested:  # a second Ctrl-C: give up on the graceful path
                raise KeyboardInterrupt
            self._stop_requested = True
            self.progress.message("[stop] finishing the current step, draining actors and writing a checkpoint "
                                  "(Ctrl-C again to abort)")

        old_int, old_term = signal.signal(signal.SIGINT, on_signal), signal.signal(signal.SIGTERM, on_signal)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)

    def _evaluate_before_training(self, metrics: MetricsWriter) -> None:
        if self.cfg.learner.eval_every and self.position.step == 0 and (before := self.evaluate()):
            metrics.write(0, before)
            self.progress.message(f"[eval] held-out accuracy before RL: {before['eval/accuracy']:.3f}")

    def _finish(self, outputs: Outputs, status: int) -> int:
        """After the loop: drain the actors, the final evaluation (unless the last step had one), the final
        checkpoint with its HF export, summary.json and the console's last line; returns the exit status."""
        lc, step = self.cfg.learner, self.position.step
        try:
            self.progress.close()
            status = self._drain(status)
            final = self.evaluate() if lc.eval_every and status == 0 and step % lc.eval_every else {}
            if final:
                outputs.metrics.write(step, final)
            ckpt = self.checkpoints.save(export=True)
            summary = run_summary(
                algo=self.cfg.algo, step=step, steps=lc.steps, stopped_early=status != 0,
                elapsed_s=self.progress.elapsed(), training_s=self.progress.training_s(), checkpoint=str(ckpt),
                model=str(hf) if (hf := self.run_dir / "hf" / f"step_{step}").is_dir() else None,
                evals=outputs.metrics.eval_summary(),
                internals={"version": self.version, "driver_pid": os.getpid(), "buffer": self.client.stats()})
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
            self.progress.message(done_line(summary))
        finally:
            outputs.metrics.close()
            self.client.close()
        return status

    def _drain(self, status: int) -> int:
        """Settle the last push and stop the actors, letting them deliver what they have in flight (at the
        end of the steps, successors still starting join first, to take up their shards' unfinished
        prompts); a failed last push makes the status 1 (the checkpoint that follows matters more)."""
        if not self.graph.actors:
            return status
        if status == 0:
            self.recovery.await_successors(PULL_POLL_S)
        try:
            self.recovery.settle_push()
        except Exception as e:
            status = status or 1
            self.progress.message(f"[actor] the last weight push failed: {str(e).strip()[:300]}")
        self.graph.stop_actors(drain=True, timeout_s=120)
        return status
