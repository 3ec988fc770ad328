"""The driver's training loop: pull a batch → learner step → weight push → new version, with
evaluation, metrics, checkpoints, actor health, the prompt ledger and a clean Ctrl-C.

No idle learner: the push of version v is started (weights gathered in the serving dtype) and left
travelling while the loop pulls and trains the batch of version v + 1; it is waited for just before
the push of v + 1 starts, before an evaluation (which must see version v) and at the end. At most one
push is in flight, so an actor is never more than one version behind the learner's pushes, and the
buffer's staleness accounting (which counts from the learner's version) is unchanged.

Ctrl-C (or SIGTERM): actors stop starting prompts and drain what is in flight into the buffer, the
buffer is snapshotted, a checkpoint is written, and every process is shut down — `--resume RUN_DIR`
then continues with no prompt skipped or trained twice (the ledger proves it).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import algos
from buffer.client import BufferClient, BufferUnavailable
from buffer.records import Key
from configs.schema import RunConfig
from launch.buffer_keeper import BufferKeeper, lost_prompts
from launch.data import RunData
from launch.ledger import PromptLedger
from launch.metrics import MetricsWriter, done_line, run_summary, wandb_init
from launch.processes import ProcessGraph
from launch.progress import Progress
from launch.roles import where
from launch.samples import SampleLog
from tasks.rewards import first_error, reward_metrics

PULL_POLL_S = 5.0  # how often a driver waiting for a batch checks actor health
HEALTH_EVERY_S = 5.0  # how often a training driver checks actor health (one parallel call to all of them)
BUFFER_TIMEOUT_S = 20.0  # the driver's buffer calls: longer than any snapshot, short enough to notice a death


class DemoBatches:
    """Batches of demonstration groups (SFT): epochs over the demonstrations in a seeded order."""

    def __init__(self, data: RunData, per_step: int, seed: int):
        import random

        from launch.model_prep import demo_group

        self._make = demo_group
        self.data, self.per_step, self.rng = data, per_step, random.Random(seed)
        self.prompts = {it.prompt_index: it.prompt_ids for it in data.train}
        self.keys = sorted(k for k in data.demos if k in self.prompts)
        self.epoch, self.order = -1, []

    def next(self) -> list:
        batch = []
        while len(batch) < self.per_step:
            if not self.order:
                self.epoch += 1
                self.order = self.keys[:]
                self.rng.shuffle(self.order)
            i = self.order.pop()
            g = self._make(self.prompts[i], self.data.demos[i], i)
            g.meta["epoch"] = self.epoch
            batch.append(g)
        return batch


def push_suspects(error: BaseException, actors: int) -> dict[int, str]:
    """{actor: why} of the actors a failed weight push blames (`WeightSyncError.suspects`, keyed by
    receiver name "actor-<i>"; read through Ray's wrapper too): those that died, stalled or never
    acknowledged the version in time."""
    for err in (error, getattr(error, "cause", None), error.__cause__):
        suspects = getattr(err, "suspects", None)
        if suspects:
            names = {f"actor-{i}": i for i in range(actors)}
            return {names[n]: f"failed the weight push: {why}" for n, why in suspects.items() if n in names}
    return {}


class Stop(Exception):
    """Raised inside the loop when the user asked the run to stop."""


class Driver:
    def __init__(self, cfg: RunConfig, graph: ProcessGraph, data: RunData, run_dir: Path, buffer_address: str,
                 progress: Progress, secrets=None, keeper: BufferKeeper | None = None):
        """keeper: owns the buffer process at `buffer_address` and restarts it when it dies (None: the
        buffer is someone else's, e.g. a test's, and a dead one ends the run)."""
        self.cfg, self.graph, self.data, self.run_dir, self.progress = cfg, graph, data, run_dir, progress
        self.client_address, self.secrets, self.keeper = buffer_address, secrets, keeper  # secrets: .public()
        self.client = BufferClient(buffer_address, "driver", timeout_s=BUFFER_TIMEOUT_S, secrets=secrets)
        self._add_demos()
        self.ledger = PromptLedger()
        spec = algos.get(cfg.algo)
        self.demos = DemoBatches(data, cfg.learner.batch_prompts, cfg.seed) if spec.trains_on_demonstrations_only \
            else None
        self.step = 0  # learner steps taken: the one owner of the weight version (`version`)
        self.resumed_from: tuple[Path, ...] = ()  # the checkpoint this run resumed from (never rotated out)
        self._stop_requested = False
        self._actor_reports: dict[int, dict] = {}  # each live actor's last stats (reward counters)
        self._reward_error_shown = False
        self._push_stats: dict = {}  # stats of the last push settled, not reported yet
        self._last_health = 0.0  # time.monotonic() of the last actor health check

    @property
    def version(self) -> int:
        """The weight version the actors must serve: one push per learner step, so it is the step count
        (the buffer, the actors and the checkpoints are told it; none of them keeps its own count)."""
        return self.step

    def _held_prompts(self) -> list[Key]:
        """(epoch, prompt) of every group the buffer holds now."""
        return [tuple(k) for k in self.client.stats().get("held_prompts", [])]

    def _add_demos(self) -> None:
        if self.data.demos:
            self.client.add_demos({int(k): v for k, v in self.data.demos.items()}, rewards=self.data.demo_rewards)

    # ------------------------------------------------------------------ resume
    def restore(self, resume_dir: Path) -> list[Key]:
        """Load the latest checkpoint of `resume_dir` into learner and buffer; returns the prompts the
        actors must skip (trained already, or held by the restored buffer)."""
        from learner.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(resume_dir / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"--resume {resume_dir}: no complete checkpoint under {resume_dir}/checkpoints "
                                    "(complete = a step_<N> directory holding the COMMITTED marker)")
        self.resumed_from = (ckpt,)
        extra = self.graph.load(ckpt)
        self.step = int(extra["step"])
        self.ledger = PromptLedger.from_state_dict(extra["ledger"])
        began = time.time()
        self.client.restore(str(ckpt / extra["buffer_snapshot"]))
        if self.keeper is not None:  # the buffer's state as of now, until the first timer snapshot
            self.keeper.taken(ckpt / extra["buffer_snapshot"], began)
        self.client.set_version(self.version)
        held = self._held_prompts()
        self.progress.message(f"[resume] {ckpt}: step {self.step}, version {self.version}, "
                              f"{len(self.ledger.trained)} prompts trained, {len(held)} held by the buffer")
        return self.ledger.accepted(held)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, export: bool = False) -> Path:
        """checkpoints/step_<step>: staged in .step_<step>.tmp, where the learner ranks write their part
        and the buffer service its snapshot, then committed (its COMMITTED marker written last) and older
        checkpoints rotated out (`learner.keep_checkpoints`; never the one this run resumed from). With
        `export`, the policy is then written as an HF model to hf/step_<step> (`learner.checkpoint`)."""
        from learner import checkpoint as ckpts

        root = self.run_dir / "checkpoints"
        final = root / f"step_{self.step}"
        staged = ckpts.stage(final)
        extra = {"step": self.step, "version": self.version, "ledger": self.ledger.state_dict(),
                 "buffer_snapshot": "buffer.msgpack", "algo": self.cfg.algo}
        self.graph.save(staged, extra)
        began = time.time()
        self.client.snapshot(str((staged / "buffer.msgpack").resolve()))
        ckpt = ckpts.commit(staged, final)
        if self.keeper is not None:
            self.keeper.taken(ckpt / "buffer.msgpack", began)
        ckpts.rotate(root, self.cfg.learner.keep_checkpoints, protect=self.resumed_from)
        if export:
            ckpts.export_hf(ckpt, self.run_dir / "hf" / f"step_{self.step}")
        return ckpt

    # ------------------------------------------------------------------ the loop
    def _on_signal(self, signum, frame) -> None:
        if self._stop_requested:  # a second Ctrl-C: give up on the graceful path
            raise KeyboardInterrupt
        self._stop_requested = True
        self.progress.message("[stop] finishing the current step, draining actors and writing a checkpoint "
                              "(Ctrl-C again to abort)")

    def _pull(self) -> tuple[list, float]:
        if self.demos is not None:
            return self.demos.next(), 0.0
        t0 = time.monotonic()
        n = self.cfg.learner.batch_prompts
        while True:
            if self._stop_requested:
                raise Stop
            try:
                groups = self._to_buffer(lambda c: c.pull_batch(n, timeout_s=PULL_POLL_S))
            except TimeoutError:
                self._check_actors()
                continue
            self.ledger.discard(self.client.last_pull["discarded"])  # settled by the buffer, not trained
            return groups, time.monotonic() - t0

    def _check_actors(self) -> dict[int, str]:
        """Health check of the actors: restart the dead ones (`_restart`); returns {actor: why} of those."""
        if not self.graph.actors:
            return {}
        stats, dead = self.graph.actor_stats()
        self._last_health = time.monotonic()
        self._actor_reports.update(stats)
        if dead:
            self._restart(dead)
        return dead

    def _restart(self, dead: dict[int, str]) -> None:
        """Replace dead actors: release their credit, start successors that walk the dead actor's shard
        from the top skipping every prompt the ledger and the buffer account for (trained, discarded or
        held: `launch.ledger`), so what it had in flight or undelivered is generated again; rebuild the
        weight-sync group, push the current weights to every actor, and only then let the successors
        generate."""
        t0 = time.monotonic()
        old_pids = {i: self.graph.pids[i] for i in dead}
        self.graph.kill_actors(list(dead))  # first: nothing they push can slip past the plans made below
        for i in dead:  # the dead actor's credit would otherwise only expire after its time-to-live
            with BufferClient(self.client_address, f"actor-{i}", timeout_s=10.0, secrets=self.secrets) as ghost:
                ghost.release_credit(2**20)
        held = self._held_prompts()
        skip = self.ledger.accepted(held)
        for i in dead:
            self._actor_reports.pop(i, None)
        self.graph.replace_actors(list(dead), skip, self.version)
        self.graph.connect_weight_sync()
        self.graph.push_weights(self.version)
        self.graph.start_rollouts(list(dead))
        for i, why in dead.items():
            self.progress.message(f"[actor] actor {i} (pid {old_pids[i]}) died ({why}); restarted as pid "
                                  f"{self.graph.pids[i]} and re-synced to version {self.version} in "
                                  f"{time.monotonic() - t0:.0f}s; its shard resumes past the {len(skip)} prompts "
                                  "trained, discarded or buffered")
        self.write_processes()

    def _to_buffer(self, call):
        """`call(client)` on a live buffer: a dead one is restarted first (a request to a dead buffer waits
        out the client's send timeout, BUFFER_TIMEOUT_S, before failing), and when it dies under the call,
        the call runs once more after the restart."""
        self._check_buffer()
        try:
            return call(self.client)
        except BufferUnavailable:
            if not self._check_buffer():
                raise
            return call(self.client)

    def _check_buffer(self) -> bool:
        """Restart the buffer process if it died (`launch.buffer_keeper`); True when it did."""
        why = self.keeper.death() if self.keeper is not None else None
        if why is None:
            return False
        t0, pid = time.monotonic(), self.keeper.pid
        self.progress.message(f"[buffer] the buffer process (pid {pid}) died ({why}); restarting it")
        info = self.keeper.restart(self.ledger.trained)
        self.client.close()
        self.client = BufferClient(self.client_address, "driver", timeout_s=BUFFER_TIMEOUT_S, secrets=self.secrets)
        if info["snapshot"] is None:
            self._add_demos()
        self.client.set_version(self.version)
        # what the actors delivered since the snapshot, read before what the new buffer holds
        delivered = self.graph.delivered_since(info["since"]) if self.graph.actors else {}
        held = self._held_prompts()
        settled = self.ledger.accepted()  # trained or discarded
        lost = {i: lost_prompts(keys, settled, held) for i, keys in delivered.items()}
        self.graph.requeue(lost)
        r = info["restored"]
        source = (f"{r.get('groups', 0)} groups restored from {info['snapshot']} ({r.get('excluded', 0)} trained "
                  "since then left out)" if info["snapshot"] else "no snapshot yet: it started empty")
        self.progress.message(f"[buffer] restarted as pid {self.keeper.pid} in {time.monotonic() - t0:.0f}s: "
                              f"{source}; {sum(map(len, lost.values()))} prompts it had lost re-queued")
        self.write_processes()
        return True

    def write_processes(self) -> None:
        """run_dir/processes.json: role -> {pid, host} of the run's processes, rewritten after a restart."""
        roles = {"driver": where()}
        if self.keeper is not None:
            roles["buffer"] = {**where(), "pid": self.keeper.pid}
        roles |= self.graph.where()
        tmp = self.run_dir / ".processes.json.tmp"
        tmp.write_text(json.dumps(roles, indent=1))
        os.replace(tmp, self.run_dir / "processes.json")

    def _settle_push(self) -> dict | None:
        """Wait for the weight push in flight (it travels while the learner pulls and trains the next
        batch) and return its stats ({} when none was in flight). A push that failed because an actor
        died restarts it, which re-syncs every actor to the current version: then None."""
        if not self.graph.actors:
            return {}
        try:
            stats = self.graph.finish_push()
            self._push_stats = stats or self._push_stats  # reported with the next metrics row
            return stats
        except Exception as e:
            stats, dead = self.graph.actor_stats()
            dead = push_suspects(e, len(self.graph.actors)) | dead  # alive but stuck in the push = dead too
            if not dead:
                raise
            self._actor_reports.update(stats)
            self.progress.message(f"[actor] a weight push failed ({str(e).strip().splitlines()[-1][:200]})")
            self._restart(dead)
            return None

    def _sync_weights(self) -> dict:
        """Settle the previous push, then start pushing the current version (unless a restart just did);
        returns the stats of the last push settled since the previous call (an evaluation settles too)."""
        if self._settle_push() is not None and self.graph.actors:
            self.graph.start_push(self.version)
        stats, self._push_stats = self._push_stats, {}
        return stats

    def evaluate(self) -> dict:
        if not self.data.eval or not self.graph.actors:
            return {}
        self._settle_push()  # evaluate the current version
        t0 = time.monotonic()
        try:
            result = self.graph.evaluate(self.data.eval)
        except Exception:
            if not self._check_actors():  # not a dead actor's fault
                raise
            result = self.graph.evaluate(self.data.eval)
        return {"eval/accuracy": result["accuracy"], "eval/n": result["n"], "time/eval_s": time.monotonic() - t0}

    def run(self) -> int:
        cfg, lc = self.cfg, self.cfg.learner
        writer = MetricsWriter(self.run_dir, tensorboard=cfg.logging.tensorboard, from_step=self.step,
                               wandb=wandb_init(cfg, self.run_dir))
        sample_log = SampleLog(self.run_dir, cfg.logging.samples_every, cfg.logging.samples_per_step,
                               self.graph.model_dir, text_sink=writer.write_text, from_step=self.step)
        old_int = signal.signal(signal.SIGINT, self._on_signal)
        old_term = signal.signal(signal.SIGTERM, self._on_signal)
        status = 0
        try:
            if lc.eval_every and self.step == 0:
                before = self.evaluate()
                if before:
                    writer.write(0, before)
                    self.progress.message(f"[eval] held-out accuracy before RL: {before['eval/accuracy']:.3f}")
            self.graph.start_rollouts()
            t_loop = t_last = time.monotonic()
            while self.step < lc.steps:
                groups, wait_s = self._pull()
                keys = [g.key for g in groups]
                self.ledger.record(self.step, keys)
                t0 = time.monotonic()
                metrics = self.graph.step(groups, self.version)
                train_s = time.monotonic() - t0
                self.step += 1
                t0 = time.monotonic()
                sync = self._sync_weights()  # sync: the previous version's push, which overlapped this step
                sync_s = time.monotonic() - t0
                buf = self._to_buffer(lambda c: c.set_version(self.version))  # with the buffer's stats
                now = time.monotonic()
                samples = sum(g.n for g in groups)
                generated = [s.reward for g in groups for s in g.samples if s.finish_reason != "demo"]
                tokens = sum(int(s.tokens.size) for g in groups for s in g.samples)
                metrics |= {
                    "version": self.version,
                    "accuracy/train": sum(r >= 1.0 for r in generated) / len(generated) if generated else None,
                    "throughput/samples_per_s": samples / (now - t_last),
                    "throughput/tokens_per_s": tokens / (now - t_last),
                    "time/generate_wait_s": wait_s, "time/train_s": train_s, "time/weight_sync_s": sync_s,
                    "time/wall_s": now - t_loop,
                    "weight_sync/gbps": sync.get("gbps"), "weight_sync/refused": sync.get("refused", 0),
                    "weight_sync/push_s": sync.get("seconds"), "weight_sync/bytes": sync.get("bytes"),
                    "weight_sync/changed_frac": sync.get("changed_frac"),
                    "buffer/dropped_stale": buf.get("dropped_stale", 0),
                    "buffer/auth_refused": buf.get("auth", {}).get("refused", 0),
                    "buffer/occupancy_groups": buf.get("occupancy_groups", 0),
                    "buffer/filtered": sum(buf.get("filtered", {}).values()),
                    "actors/restarts": self.graph.restarts,
                    "buffer/restarts": self.keeper.restarts if self.keeper is not None else 0,
                    **reward_metrics(self._actor_reports.values()),  # as of the last health check
                }
                t_last = now
                if not self._reward_error_shown and (err := first_error(self._actor_reports.values())):
                    self._reward_error_shown = True
                    self.progress.message(f"[reward] a reward call failed and scored 0 (counted in reward/errors; "
                                          f"shown once): {err}")
                if lc.eval_every and self.step % lc.eval_every == 0:
                    metrics |= self.evaluate()
                export = bool(lc.hf_every) and self.step % lc.hf_every == 0
                if export or (lc.save_every and self.step % lc.save_every == 0):
                    self.checkpoint(export=export)
                elif self.keeper is not None:
                    self._to_buffer(self.keeper.maybe_snapshot)
                writer.write(self.step, metrics)
                sample_log.write(self.step, groups)
                self.progress.update(self.step, metrics, every=cfg.logging.log_every)
                if time.monotonic() - self._last_health >= HEALTH_EVERY_S:
                    self._check_actors()
        except Stop:
            status = 130
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
        try:
            self.progress.close()
            if self.graph.actors:
                try:
                    self._settle_push()
                except Exception as e:  # the checkpoint below matters more than the last push
                    status = status or 1
                    self.progress.message(f"[actor] the last weight push failed: {str(e).strip()[:300]}")
                self.graph.stop_actors(drain=True, timeout_s=120)
            final = self.evaluate() if lc.eval_every and status == 0 and self.step % lc.eval_every else {}
            if final:
                writer.write(self.step, final)
            ckpt = self.checkpoint(export=True)
            summary = run_summary(
                algo=cfg.algo, step=self.step, steps=lc.steps, stopped_early=status != 0,
                elapsed_s=self.progress.elapsed(), training_s=self.progress.training_s(), checkpoint=str(ckpt),
                model=str(hf) if (hf := self.run_dir / "hf" / f"step_{self.step}").is_dir() else None,
                evals=writer.eval_summary(),
                internals={"version": self.version, "driver_pid": os.getpid(), "buffer": self.client.stats()})
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
            self.progress.message(done_line(summary))
        finally:
            writer.close()
            self.client.close()
        return status
