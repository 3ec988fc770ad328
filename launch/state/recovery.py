"""Keeping the run's processes alive for the driver: a dead actor or a dead buffer process is
restarted where the run is, and no prompt is skipped or trained twice (the prompt ledger decides what
is regenerated, `launch.state.ledger`).

- Actors: a health check (`check_actors`, and a weight push that blames them, `settle_push`) finds
  the dead ones; `restart_actors` kills them, releases their credit, starts successors in the background
  that skip every prompt the ledger and the buffer account for, and re-forms the weight sync of the
  others, which go on generating: training does not wait for a restart (issue 33). `admit_successors`
  brings a successor in once its engine is up: the weights are re-synced, and only then does it generate.
- The buffer: every driver call to it goes through `call_on_live_buffer`, which restarts a dead buffer
  first (`launch.state.buffer_keeper`: from its latest snapshot minus what was trained since) and re-queues
  the prompts only the dead buffer had to the actors that delivered them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from buffer.client import BufferClient, BufferUnavailable
from buffer.records import Key
from launch.processes.process_graph import RoleLost
from launch.processes.roles import first_line, named, where
from launch.state.buffer_keeper import BufferKeeper, lost_prompts
from launch.state.position import RunPosition
from launch.state.scaling import read_request

HEALTH_EVERY_S = 5.0  # how often a training driver checks actor health (one parallel call to all of them)
BUFFER_TIMEOUT_S = 20.0  # the driver's buffer calls: longer than any snapshot, short enough to notice a death
BUFFER_EXIT_S = 2.0  # how long a buffer that dropped the connection may take to be seen dead (`await_buffer_exit`)


class DeadDuringPush(Exception):
    """Actors found dead while a weight push was awaited: {actor: why} in `dead`."""

    def __init__(self, dead: dict[int, str]):
        super().__init__(dead)
        self.dead = dead


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


class Recovery:
    """The driver's handle on its actors and buffer process, restarting whichever died.

    position: the driver's (read for the version and the ledger at each restart). keeper: owns the
    buffer process at `buffer_address` (None: the buffer is someone else's, e.g. a test's, and a dead
    one ends the run). data: the run's demonstrations, which a buffer that starts empty is given."""

    def __init__(self, graph, position: RunPosition, progress, run_dir: Path, buffer_address: str, *,
                 data=None, secrets=None, keeper: BufferKeeper | None = None):
        self.graph, self.position, self.progress, self.run_dir = graph, position, progress, run_dir
        self.address, self.data, self.secrets, self.keeper = buffer_address, data, secrets, keeper
        self.client = self._connect()  # replaced when the buffer restarts
        self.add_demos()
        self.reports: dict[int, dict] = {}  # each live actor's last stats (reward counters)
        self.last_health = 0.0  # time.monotonic() of the last actor health check
        self.unreported_push: dict = {}  # stats of the last push settled, until a metrics row takes them
        self.dead_since: dict[int, float] = {}  # successor starting -> time.monotonic() its predecessor was found dead
        self.grown: dict[int, int] = {}  # a scale-up's actors up so far -> pid (they join together)
        self.growth_since = 0.0  # time.monotonic() of the scale-up in flight
        self.scale_to: int | None = None  # an `algo-train scale` request not taken up yet
        self.scale_seen = read_request(run_dir, None)[1]  # requests from before this (re)start are not this run's

    def _connect(self) -> BufferClient:
        return BufferClient(self.address, "driver", timeout_s=BUFFER_TIMEOUT_S, secrets=self.secrets)

    # ------------------------------------------------------------------ the buffer
    def add_demos(self) -> None:
        """Give the buffer the run's demonstrations (it attaches them to guided groups)."""
        if self.data is not None and self.data.demos:
            self.client.add_demos({int(k): v for k, v in self.data.demos.items()}, rewards=self.data.demo_rewards)

    def held_prompts(self) -> list[Key]:
        """(epoch, prompt) of every group the buffer holds now."""
        return [tuple(k) for k in self.client.stats().get("held_prompts", [])]

    def call_on_live_buffer(self, call):
        """`call(client)` on a live buffer: a dead one is restarted first (a request to a dead buffer waits
        out the client's send timeout, BUFFER_TIMEOUT_S, before failing), and when it dies under the call,
        the call runs once more after the restart."""
        self.restart_dead_buffer()
        try:
            return call(self.client)
        except BufferUnavailable:
            self.await_buffer_exit()
            if not self.restart_dead_buffer():
                raise
            return call(self.client)

    def await_buffer_exit(self, within_s: float = BUFFER_EXIT_S) -> None:
        """A killed process closes its sockets a moment before it can be reaped: the driver's client may see
        the connection lost while the process still counts as alive. Give its exit up to `within_s` to show."""
        deadline = time.monotonic() + within_s
        while self.keeper is not None and self.keeper.death() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart_dead_buffer(self) -> bool:
        """Restart the buffer process if it died (`launch.state.buffer_keeper`); True when it did."""
        why = self.keeper.death() if self.keeper is not None else None
        if why is None:
            return False
        t0 = time.monotonic()
        was = named("the buffer process", self.keeper.pid, where()["host"], self.keeper.log_path)  # the driver's host
        ledger = self.position.ledger
        try:
            info = self.keeper.restart(ledger.trained)
        except Exception as e:  # noqa: BLE001 - whatever stopped the new process, the run cannot go on
            cause = (str(e).strip().splitlines() or [""])[0][:200]
            raise RoleLost(f"[buffer] {was} died ({why}); starting a new one failed ({type(e).__name__}: {cause})"
                           "; the run stopped") from e
        self.client.close()
        self.client = self._connect()
        if info["snapshot"] is None:
            self.add_demos()
        self.client.set_version(self.position.version)
        # what the actors delivered since the snapshot, read before what the new buffer holds
        delivered = self.graph.delivered_since(info["since"]) if self.graph.actors else {}
        held = self.held_prompts()
        settled = ledger.accepted()  # trained or discarded
        lost = {i: lost_prompts(keys, settled, held) for i, keys in delivered.items()}
        self.graph.requeue(lost)
        r = info["restored"]
        source = (f"{r.get('groups', 0)} groups restored from {info['snapshot']} ({r.get('excluded', 0)} trained "
                  "since then left out)" if info["snapshot"] else "no snapshot yet: it started empty")
        self.progress.message(f"[buffer] {was} died ({why}); restarted as pid {self.keeper.pid} in "
                              f"{time.monotonic() - t0:.0f}s: {source}; {sum(map(len, lost.values()))} prompts it "
                              "had lost re-queued")
        self.write_processes()
        return True

    # ------------------------------------------------------------------ the actors
    def check_actors(self) -> dict[int, str]:
        """Health check of the actors: restart the dead ones (`restart_actors`); returns {actor: why} of those."""
        if not self.graph.actors:
            return {}
        stats, dead = self.graph.actor_stats()
        self.last_health = time.monotonic()
        self.reports.update(stats)
        if dead:
            self.restart_actors(dead)
        return dead

    def check_actors_if_due(self) -> None:
        """`check_actors` when the last check is HEALTH_EVERY_S old."""
        if time.monotonic() - self.last_health >= HEALTH_EVERY_S:
            self.check_actors()

    def restart_actors(self, dead: dict[int, str]) -> None:
        """Replace dead actors without stopping the run: kill them, release their credit, start successors
        in the background (`_replace`), and rebuild the weight-sync group of the live actors with a push of
        the current version (a push in flight is dropped with the old group, and one a death failed left
        the others without a version). Training goes on with the live actors' groups; a successor joins once
        its engine is up (`admit_successors`). An actor found dead meanwhile is replaced the same way."""
        while dead:
            self._replace(dead)
            dead = self._resync(self.position.version)

    def _replace(self, dead: dict[int, str]) -> None:
        """Kill the actors `dead` ({actor: why}), release their credit and start their successors, which
        walk the dead actor's shard from the top skipping every prompt the ledger and the buffer account
        for (trained, discarded or held: `launch.state.ledger`), so what it had in flight or undelivered is
        generated again. The plan is made after the kill: nothing a dead actor pushes can slip past it, and
        nothing of its shard is generated by anyone else until its successor does."""
        was = {i: self.graph.actor_named(i) for i in dead}  # pid, host and log of the dead process
        self.graph.kill_actors(list(dead))
        self._release_credit(dead)
        skip = self.position.ledger.accepted(self.held_prompts())
        self.graph.begin_replacing(list(dead), skip, self.position.version)
        others = len(self.graph.live)
        meanwhile = (f"training goes on with the other {others} actor(s)" if others else
                     "no actor generates until it is up")
        for i, why in dead.items():
            self.reports.pop(i, None)
            self.dead_since[i] = time.monotonic()
            self.progress.message(f"[actor] {was[i]} died ({why}); its successor starts in the background and "
                                  f"{meanwhile}; its shard resumes past the {len(skip)} prompts trained, discarded "
                                  "or buffered")
        self.write_processes()

    def admit_successors(self, wait_s: float | None = 0.0) -> bool:
        """Actors whose engines are up (waiting up to `wait_s` for one) join the run: successors, and a
        scale-up's actors once all of them are up (`launch.state.scaling`). The push in flight lands first,
        the weight-sync group is rebuilt with them (after a scale-up every actor takes its new shard first:
        `_reshard`), the current version is pushed to every live actor (the one push the others pause for),
        and then they generate. True when it pushed the current version (the caller's own push of it is
        done). A successor whose engine failed to start stops the run (`RoleLost`: a start that fails once
        fails again); a scale-up that failed is cancelled with one line."""
        up, failed = self.graph.poll_replacements(wait_s)
        added = range(self.graph.shards, len(self.graph.actors))  # a scale-up's ids
        if any(i in added for i in failed):
            self._cancel_growth(next(e for i, e in failed.items() if i in added))
            up = {i: pid for i, pid in up.items() if i not in added}
        for i, error in failed.items():
            if i not in added:
                raise RoleLost(f"[actor] the successor of actor {i} did not start ({first_line(error)}); the run "
                               "stopped")
        self.grown |= {i: pid for i, pid in up.items() if i in added}
        up = {i: pid for i, pid in up.items() if i not in added}
        growing = bool(added) and set(self.grown) == set(added)
        if not up and not growing:
            return False
        version = self.position.version
        self.settle_push()  # the group is about to be rebuilt: the push on the old one lands first
        self.graph.admit(list(up) + (list(added) if growing else []))
        if growing:
            self._reshard(len(self.graph.actors))
        self.restart_actors(self._resync(version))
        joined = [i for i in up if i in self.graph.live]
        self.graph.start_rollouts(self.graph.live if growing else joined)
        self.write_processes()  # before the lines below: whoever reads them finds processes.json already says so
        for i in joined:
            self.progress.message(f"[actor] actor {i} restarted as pid {self.graph.pids[i]} and joined at version "
                                  f"{version} in {time.monotonic() - self.dead_since.pop(i):.0f}s (training went "
                                  "on meanwhile)")
        if growing:
            pids = ", ".join(str(self.graph.pids[i]) for i in added)
            self.progress.message(f"[scale] actors {', '.join(map(str, added))} joined (pids {pids}) at version "
                                  f"{version} in {time.monotonic() - self.growth_since:.0f}s: the run has "
                                  f"{len(self.graph.actors)} actors, each on shard i::{self.graph.shards}")
            self.grown = {}
        return True

    def await_successors(self, every_s: float, until_live: bool = False) -> None:
        """Admit successors as they come up until none is starting (`until_live`: until some actor is
        live): evaluation and the final drain need them. (A scale-up's actors are not waited for.)"""
        def starting():
            return [i for i in self.graph.replacing if i < self.graph.shards]
        while starting() and not (until_live and self.graph.live):
            self.admit_successors(every_s)

    # ------------------------------------------------------------------ scaling (`launch.state.scaling`)
    def follow_scale_requests(self) -> None:
        """Take up an `algo-train scale` request (after a step): start a scale-up's actors in the
        background, or shrink the run now. A request waits while actors are starting."""
        asked, self.scale_seen = read_request(self.run_dir, self.scale_seen)
        if asked is not None:
            self.scale_to = asked
        if self.scale_to is None or self.graph.replacing or not self.graph.actors:
            return
        want, have = self.scale_to, len(self.graph.actors)
        self.scale_to = None
        if want > have:
            ids = self.graph.begin_adding(want - have, self.position.version)
            self.growth_since = time.monotonic()
            self.progress.message(f"[scale] asked for {want} actors: actors {', '.join(map(str, ids))} start in the "
                                  f"background and training goes on with {have}")
        elif want < have:
            t0 = time.monotonic()
            self.settle_push()
            self._reshard(want, leaving=list(range(want, have)))
            self.restart_actors(self._resync(self.position.version))
            self.graph.start_rollouts()
            self.progress.message(f"[scale] asked for {want} actors: actors {', '.join(map(str, range(want, have)))} "
                                  f"left after delivering what they had in flight, in {time.monotonic() - t0:.0f}s; "
                                  f"the run has {want} actors, each on shard i::{want}")
            self.write_processes()

    def _reshard(self, n: int, leaving: list[int] = ()) -> None:
        """The actor count becomes `n`: every live actor stops starting prompts and delivers what it has in
        flight, the `leaving` ones are stopped for good (their credit released), and the others take shards
        i::n walked past every prompt the ledger and the buffer account for. Nothing is in flight while the
        plan is made, so no prompt is generated twice, and none is lost."""
        self.graph.stop_actors(drain=True, timeout_s=120)
        if leaving:
            self.graph.remove_actors(leaving)
            self._release_credit(leaving)
        self.graph.reshard(n, self.position.ledger.accepted(self.held_prompts()))

    def _cancel_growth(self, error: BaseException) -> None:
        added = list(range(self.graph.shards, len(self.graph.actors)))
        self.graph.remove_actors(added)
        self._release_credit(added)
        self.grown = {}
        self.progress.message(f"[scale] the scale-up to {len(added) + self.graph.shards} actors was cancelled "
                              f"({first_line(error)}); the run stays at {self.graph.shards} actors")

    def _release_credit(self, ids) -> None:
        """Give back the buffer credit actors `ids` held (dead or gone: it would otherwise only expire)."""
        for i in ids:
            with BufferClient(self.address, f"actor-{i}", timeout_s=10.0, secrets=self.secrets) as ghost:
                ghost.release_credit(2**20)

    def _resync(self, version: int) -> dict[int, str]:
        """Rebuild the weight-sync group and push `version` to every actor; {} when that worked, else
        {actor: why} of the actors found dead by then (another actor died during a restart: the caller
        replaces it too). A failure no dead actor explains is raised."""
        try:
            self.graph.connect_weight_sync()
            self.graph.push_weights(version)
            return {}
        except Exception as e:
            return self._blame(e)

    def _blame(self, error: Exception, retry: bool = True) -> dict[int, str]:
        """{actor: why} of the actors a failed weight-sync call implicates: dead by the health check, or
        named by the error (alive but stuck in the push = dead too). When none is, the push is retried once on a
        rebuilt group (`_retry_unblamed`; with `retry` False, or when that fails too, `error` is raised)."""
        stats, dead = self.graph.actor_stats()
        dead = push_suspects(error, len(self.graph.actors)) | dead
        if not dead:  # a push no receiver explains: one whose engine core is stopped hangs the broadcast for all
            dead = self.graph.silent_engines()
        if not dead:
            if not retry:
                raise error
            return self._retry_unblamed(error)
        self.reports.update(stats)
        return dead

    def _retry_unblamed(self, error: Exception) -> dict[int, str]:
        """A push failed and no actor is to blame: every actor answers, beats and nacked nothing (a transport
        hang inside the broadcast: an IB link flap, a blocked NCCL proxy thread). Rebuild the weight-sync group
        and push the current version once more, dense (a new sender's first push): a transient fault then costs
        one rebuild instead of a stopped run and a restart from the last checkpoint. One console line says
        which way it went; {actor: why} of actors the retry blames, {} when it worked; raises when it failed
        with nobody to blame again."""
        version = self.position.version
        said = (f"[weights] a weight push failed and no actor is to blame ({first_line(error)}); the weight-sync "
                f"group was rebuilt and version {version} pushed dense")
        try:
            self.graph.connect_weight_sync()
            self.graph.push_weights(version)
        except Exception as again:
            try:
                dead = self._blame(again, retry=False)
            except Exception:
                self.progress.message(f"{said}, which failed too ({first_line(again)}): the run stops")
                raise
            self.progress.message(f"{said}, which failed on actor(s) {', '.join(map(str, sorted(dead)))}: "
                                  "they are replaced")
            return dead
        self.progress.message(f"{said} to {len(self.graph.live)} actor(s): the run goes on")
        return {}

    def settle_push(self) -> dict | None:
        """Wait for the weight push in flight (it travels while the learner pulls and trains the next
        batch) and return its stats ({} when none was in flight; kept in `unreported_push` for the next
        metrics row). A push that failed because an actor died restarts it, which re-syncs every actor
        to the current version: then None."""
        if not self.graph.actors:
            return {}
        try:
            stats = self.graph.finish_push(watch=self._watch_push)
            self.unreported_push = stats or self.unreported_push
            return stats
        except DeadDuringPush as e:  # seen by the health check before the push gave up on it (~10 s later)
            self.restart_actors(e.dead)  # the new group drops the push: the live actors get the version again
            return None
        except Exception as e:
            self.restart_actors(self._blame(e))  # says it, one line per actor: the push's own error adds nothing
            return None

    def _watch_push(self) -> None:
        """While a push is awaited: a dead actor (Ray says so at once) ends the wait (`DeadDuringPush`)."""
        stats, dead = self.graph.actor_stats()
        self.reports.update(stats)
        if dead:
            raise DeadDuringPush(dead)

    # ------------------------------------------------------------------ processes.json
    def write_processes(self) -> None:
        """run_dir/processes.json: role -> {pid, host} of the run's processes, rewritten after a restart."""
        roles = {"driver": where()}
        if self.keeper is not None:
            roles["buffer"] = {**where(), "pid": self.keeper.pid}
        roles |= self.graph.where()
        tmp = self.run_dir / ".processes.json.tmp"
        tmp.write_text(json.dumps(roles, indent=1))
        os.replace(tmp, self.run_dir / "processes.json")
