"""`ProcessGraph`: the roles of a run (learner ranks, rollout actors) placed as Ray actors — or, with
`--serial`, as plain objects in this process — behind one set of methods the driver calls.

Ray is reached here (`launch.planning.cluster.init_ray`: the cluster the launch resolved into `cfg.ray_address`,
else a local Ray), the roles' placement groups are reserved before any role starts
(`launch.planning.placement.Placement`: learner ranks packed, actors spread, a deadline instead of a hang), and
each role runs in a bundle of its group with explicit resources (CPU shares, GPUs, custom resources)
from the resolved config. A dead actor (its process gone, unresponsive, or its vLLM
engine dead) is found by the health check the driver runs every step and whenever a weight push fails;
`begin_replacing` starts a successor in the background, one that walks the dead actor's shard past every
prompt the ledger accounts for (`launch.state.ledger`). Meanwhile the run goes on with the `live` actors
(those in the weight-sync group, generating); once `poll_replacements` reports the successor's engine up,
the driver `admit`s it: the group is rebuilt with it, the current weights pushed, and only then does it
generate (see `launch.state.recovery`).

A crashed actor's vLLM engine processes do not linger beside its replacement: Ray puts every worker in
a process group of its own and kills the group when the worker dies (`RAY_process_group_cleanup_enabled`,
on by default in the pinned Ray; the actor-restart end-to-end test checks it).
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import algos
from buffer.records import Key
from configs.schema import RunConfig
from launch.planning.cluster import cluster_nodes, init_ray, joins_cluster
from launch.prep.data import RunData
from launch.processes.joining import EngineStarts, first_failure, shares_gpus, unformed_line
from launch.processes.learner_ranks import LearnerDied, LearnerRanks
from launch.processes.membership import Membership
from launch.processes.roles import LOG_FILE_ENV, LearnerRank, LocalRole, first_line, named


class RoleLost(RuntimeError):
    """A role the run cannot do without died and could not be replaced (the buffer's restart failed). The
    message is one line naming the process, why, and its log; the launcher adds how to go on."""


class WeightSyncUnformed(RoleLost):
    """The weight-sync group did not form (an actor could not join learner rank 0's, or the sender gave up
    waiting): one line naming the role, its error and what to check (`joining.unformed_line`)."""


def engine_death(stats: dict) -> str:
    """Why an actor's stats say its engine is dead: the reason it gave (a wedged engine: `actors.deadlines`),
    else that vLLM's engine died."""
    why = stats["engine_dead"]
    return why if isinstance(why, str) else "its vLLM engine died"


class ProcessGraph(LearnerRanks, Membership):
    def __init__(self, cfg: RunConfig, model_dir: Path, data: RunData, secrets=None, log=print,
                 log_dir: Path | None = None):
        """secrets: the run's client credentials (`RunSecrets.public()`) handed to every actor; the
        buffer's address is set once the buffer runs (`buffer_address`). log_dir: where each Ray role
        writes its output (`<role>.log`, `launch.processes.roles.to_log_file`); None = Ray forwards it to the
        terminal (logging.verbose)."""
        self.cfg, self.model_dir, self.data, self.secrets, self.log = cfg, model_dir, data, secrets, log
        self.log_dir = None if cfg.serial else log_dir
        self.buffer_address: str | None = None
        self.serial = cfg.serial
        self.ranks: list = []
        self.actors: list = []
        self.pids: list[int] = []  # process of each actor (the driver's own with --serial)
        self._train = None  # the training prompts as the actors get them (`start_actors`)
        self._starting: EngineStarts | list = []  # the actors' starts in flight (`start_actors` -> `await_actors`)
        self.live: list[int] = []  # actors in the weight-sync group, generating: all but successors starting
        self._replacing: EngineStarts | None = None  # successors' engine starts in flight (`begin_replacing`)
        self._replaced: dict[int, int] = {}  # --serial: successors started, until `poll_replacements` says so
        self._growth = None  # a scale-up's (placement group, actor ids, time.monotonic() asked), until all are up
        self.shards = 0  # the prompts are cut into this many shards, one per actor (`start_actors`, `reshard`)
        self._actors_since = 0.0  # monotonic time `start_actors` began
        self.restarts = 0
        self._where: dict[str, dict] = {}  # role -> {pid, host}, as of the last `where()`
        if not self.serial:
            import ray

            from launch.planning.placement import Placement
            from launch.planning.resources import local_node, plan

            init_ray(cfg)
            self._ray = ray
            try:  # the nodes the launch checked: a local Ray's memory resource is only Ray's estimate
                joined = joins_cluster(cfg)
                p = plan(cfg, cluster_nodes() if joined else [local_node()], joined=joined,
                         driver=ray.util.get_node_ip_address() if joined else None)
                self.placement = Placement(p, cfg.placement_timeout_s)
                self.placement.reserve()
            except Exception:
                ray.shutdown()
                raise
            log(f"[graph] placement: {p.summary()}")

    # ------------------------------------------------------------------ helpers
    def teacher_devices(self) -> list[str | None]:
        """CUDA_VISIBLE_DEVICES of each teacher engine the run starts in this process (`Placement.teacher_devices`;
        --serial: None each, the process's own GPUs)."""
        from launch.planning.resources import teacher_engines

        return [None] * teacher_engines(self.cfg) if self.serial else self.placement.teacher_devices()

    def node_ip(self) -> str:
        """This (the driver's) node's IP as Ray reports it: what services the driver starts advertise."""
        return self._ray.util.get_node_ip_address()

    def _get(self, futures, timeout: float | None = None):
        if self.serial:
            return futures
        return self._ray.get(futures, timeout=timeout)

    def log_file(self, role: str) -> Path | None:
        """The file role `role` ("learner-0", "actor-1") writes its output to (None: the terminal)."""
        return None if self.log_dir is None else self.log_dir / f"{role}.log"

    def log_ref(self, role: str, handle) -> str:
        """Where to read the output of `role`, Ray actor `handle`: its log file, or with logging.verbose
        (output on the terminal, and in Ray's files) Ray's command that prints it."""
        log = self.log_file(role)
        return str(log) if log is not None else f"`ray logs actor --id {handle._actor_id.hex()}`"

    def actor_named(self, i: int) -> str:
        """Actor `i` as a fault message names it (`launch.processes.roles.named`): its process as last seen by
        `where` (read before a successor replaces it)."""
        host = self._where.get(f"actor/{i}", {}).get("host", "?")
        log = None if self.serial else self.log_ref(f"actor-{i}", self.actors[i])  # --serial: the terminal
        return named(f"actor {i}", self.pids[i], host, log)

    def _make(self, cls, *, num_cpus: float, num_gpus: float, max_concurrency: int, env: dict | None = None,
              bundle: int = -1, role: str = ""):
        """Constructor of `cls` as a Ray actor in bundle `bundle` (-1 = any free one) of its placement
        group (learner ranks: "learner", actors: "actors"), or a plain object with --serial."""
        if self.serial:
            return lambda *a, **k: LocalRole(cls(*a, **k))
        group, section = ("learner", self.cfg.learner) if cls is LearnerRank else ("actors", self.cfg.rollout)
        opts = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_concurrency": max_concurrency, "max_restarts": 0,
                "scheduling_strategy": self.placement.strategy(group, bundle)}
        if section.custom_resources:
            opts["resources"] = dict(section.custom_resources)
        env = dict(env or {})
        if self.log_file(role) is not None:
            env[LOG_FILE_ENV] = str(self.log_file(role))
        if env:
            opts["runtime_env"] = {"env_vars": env}
        return self._ray.remote(cls).options(**opts).remote

    def _new_actor(self, i: int, skip: list[Key], version: int):
        """Actor `i` on shard i::`shards` (an actor added by a scale-up is resharded before it generates)."""
        from launch.processes.actor_role import ActorRole, actor_env

        r = self.cfg.rollout
        env = actor_env(self.cfg)
        if self.serial:  # the engine processes inherit this process's environment
            os.environ.update(env)
        make = self._make(ActorRole, num_cpus=r.cpus_per_actor, num_gpus=r.gpus_per_actor, max_concurrency=4,
                          env=env, bundle=i, role=f"actor-{i}")
        return make(self.cfg, i, str(self.model_dir), self.buffer_address, self._train, version,
                    [list(k) for k in skip], self.secrets, max(self.shards, i + 1))

    def start_actors(self, skip: list[Key], version: int = 0) -> None:
        """Create the actors and start their engines, without waiting (`await_actors` does): the learner
        ranks can start meanwhile."""
        if algos.get(self.cfg.algo).trains_on_demonstrations_only:
            return
        # the training prompts: put in Ray's object store once, not pickled into every actor's arguments
        self._train = self.data.train if self.serial else self._ray.put(self.data.train)
        self._actors_since = time.monotonic()
        self.shards = self.cfg.rollout.num_actors
        self.actors = [self._new_actor(i, skip, version) for i in range(self.shards)]
        self._starting = self._start_engines(list(range(len(self.actors))))

    def _start_engines(self, ids: list[int], more: EngineStarts | None = None) -> EngineStarts | list:
        """Start the engines of actors `ids` (added to the starts `more` when given): at once, but those
        sharing a GPU one after another (`launch.processes.joining`); `--serial` starts them in turn as it
        calls them."""
        if self.serial:
            return [self.actors[i].start.remote() for i in ids]
        shared = shares_gpus(self.cfg.rollout.gpus_per_actor)
        keys = self._get([self.actors[i].gpu.remote() for i in ids]) if shared else [None] * len(ids)
        if more is None:
            return EngineStarts(self._ray, ids, lambda i: self.actors[i].start.remote(), keys)
        more.add(ids, keys)
        return more

    def await_actors(self) -> None:
        """Wait until every engine `start_actors` started is up; says how long it took."""
        if not self.actors:
            return
        self.pids = self._starting if self.serial else [pid for _, pid in sorted(self._starting.wait().items())]
        self.live = list(range(len(self.actors)))
        pids = "" if self.serial else f" (pids {', '.join(map(str, self.pids))})"
        self.log(f"[graph] {len(self.actors)} vLLM actor(s) up in {time.monotonic() - self._actors_since:.0f}s{pids}")

    def connect_weight_sync(self) -> None:
        """Every live actor joins a new weight-sync group of rank 0's (on rank 0's node, admitted with the
        run's weight-sync token) and follows its pushes; with none live, rank 0 closes its group and pushes
        go nowhere until a successor is admitted."""
        if not self.actors:
            return
        token = self._weight_sync_token
        live = [self.actors[i] for i in self.live]
        address = self._on_ranks(self.ranks[0].reset_sender.remote(len(live), token))
        if not live:
            return
        host, port = address
        if self.serial:  # the sender waits for every receiver: join them from their own loop threads
            import threading

            threads = [threading.Thread(target=a.connect_weight_sync.remote, args=(host, port, token))
                       for a in live]
            for t in threads:
                t.start()
            self.ranks[0].connect_sender.remote()
            for t in threads:
                t.join()
        else:
            joins = [a.connect_weight_sync.remote(host, port, token) for a in live]
            sender = self.ranks[0].connect_sender.remote()
            try:
                self._get(joins + [sender])
            except Exception as e:  # an actor's or the sender's failure (the actors time out if rank 0 died)
                dead = self._dead_ranks(e)  # a dead rank stops the run as LearnerDied: --max-restarts resumes it
                if dead:
                    raise LearnerDied(dead) from None
                calls = [(partial(self.actor_named, i), ref) for i, ref in zip(self.live, joins)] + [(self.rank0_named, sender)]
                raise WeightSyncUnformed(unformed_line(*first_failure(self._ray, calls, e), (host, port))) from e
        self._get([a.follow_weight_updates.remote() for a in live])

    def start_rollouts(self, which: list[int] | None = None) -> None:
        """Start generating on the actors `which` (the live ones by default)."""
        ids = self.live if which is None else which
        self._get([self.actors[i].start_rollouts.remote() for i in ids])

    def actor_stats(self, timeout_s: float = 30.0) -> tuple[dict[int, dict], dict[int, str]]:
        """({actor: stats} of the live actors that answer, {actor: why it counts as dead} of the others),
        asked of every live actor at once: one deadline of `timeout_s` for all of them, not one each.
        (Successors still starting are `poll_replacements`'s.)"""
        if self.serial:
            stats = {i: self.actors[i].stats.remote() for i in self.live}
            dead = {i: engine_death(st) for i, st in stats.items() if st.get("engine_dead")}
            return {i: st for i, st in stats.items() if i not in dead}, dead
        refs = [self.actors[i].stats.remote() for i in self.live]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        stats, dead, ready = {}, {}, set(ready)
        for i, ref in zip(self.live, refs):
            if ref not in ready:
                dead[i] = f"no answer within {timeout_s:.0f}s"
                continue
            try:
                st = self._ray.get(ref)
            except self._ray.exceptions.RayActorError as e:
                dead[i] = f"process gone: {type(e).__name__}"
                continue
            if st.get("engine_dead"):
                dead[i] = engine_death(st)
            else:
                stats[i] = st
        return stats, dead

    def silent_engines(self, timeout_s: float = 10.0) -> dict[int, str]:
        """{actor: why} of the live actors whose engine core does not answer within `timeout_s`
        (`RolloutActor.engine_answers`), asked of all at once; an actor that does not answer at all counts too."""
        if self.serial:
            return {i: f"its engine core did not answer within {timeout_s:g} s" for i in self.live
                    if not self.actors[i].engine_answers.remote(timeout_s)}
        refs = {i: self.actors[i].engine_answers.remote(timeout_s) for i in self.live}
        if not refs:
            return {}
        ready, _ = self._ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s + 20)
        silent = {}
        for i, ref in refs.items():
            try:
                answered = ref in ready and self._ray.get(ref)
            except Exception:  # noqa: BLE001 - the actor itself is gone: silent too
                answered = False
            if not answered:
                silent[i] = f"its engine core did not answer within {timeout_s:g} s"
        return silent

    def kill_actors(self, ids: list[int], timeout_s: float = 30.0) -> None:
        """Kill the actors `ids` and wait until Ray reports them dead (at most `timeout_s`), so none of
        them can push another group once the driver decides what their successors must generate."""
        for i in ids:
            try:
                if self.serial:
                    self.actors[i].close.remote()
                else:
                    self._ray.kill(self.actors[i], no_restart=True)
            except Exception as e:  # noqa: BLE001 - it is dead already, or dying: go on
                self.log(f"[graph] stopping actor {i} failed: {e}")
        if self.serial:
            return
        deadline = time.monotonic() + timeout_s
        for i in ids:
            while time.monotonic() < deadline:
                try:
                    self._ray.get(self.actors[i].stats.remote(), timeout=1.0)
                except self._ray.exceptions.RayActorError:
                    break
                except self._ray.exceptions.GetTimeoutError:
                    pass
            else:
                self.log(f"[graph] actor {i} was not reported dead within {timeout_s:.0f}s of its kill")

    def delivered_since(self, wall_time: float) -> dict[int, list]:
        """{actor: (epoch, prompt) keys the buffer acknowledged since `wall_time`}, asked of every live
        actor at once (a successor still starting has delivered nothing)."""
        return dict(zip(self.live, self._get([self.actors[i].delivered_since.remote(wall_time) for i in self.live])))

    def set_demos(self, demos: dict) -> None:
        """Every live actor's prompts take these demonstrations (a live teacher's traces), and so do the
        training prompts a later actor (a dead one's successor) starts from."""
        from actors.prompts import with_demos

        self.data.train = with_demos(self.data.train, demos)
        self._train = self.data.train if self.serial else self._ray.put(self.data.train)
        self._get([self.actors[i].set_demos.remote(demos) for i in self.live])

    def requeue(self, keys_by_actor: dict[int, list]) -> None:
        self._get([self.actors[i].requeue.remote(keys) for i, keys in keys_by_actor.items() if keys])

    def where(self) -> dict[str, dict]:
        """{role: {pid, host}} of the learner ranks and live actors (`processes.json`)."""
        roles = [f"learner/{r}" for r in range(len(self.ranks))] + [f"actor/{i}" for i in self.live]
        handles = self.ranks + [self.actors[i] for i in self.live]
        self._where = dict(zip(roles, self._get([h.where.remote() for h in handles])))
        return self._where

    def evaluate(self, items) -> dict:
        """Held-out accuracy, the items spread over the live actors (the k-th scores items k, k + N, ...)
        and the accuracies weighted by their counts; `per_prompt`: every [prompt_index, reward], by index; with
        tools, the share of responses that got a tool result (`tool_share`), weighted alike."""
        live = [self.actors[i] for i in self.live]
        n = len(live)
        results = self._get([a.evaluate.remote(items[k::n]) for k, a in enumerate(live) if items[k::n]])
        total = sum(r["n"] for r in results)
        out = {"accuracy": sum(r["accuracy"] * r["n"] for r in results) / total if total else float("nan"),
               "n": total, "per_prompt": sorted(p for r in results for p in r["per_prompt"])}
        if results and all(r.get("tool_share") is not None for r in results):  # tools (envs/): multi-turn evaluation
            out["tool_share"] = sum(r["tool_share"] * r["n"] for r in results) / total
        return out

    def stop_actors(self, drain: bool, timeout_s: float) -> None:
        """Stop the live actors (drain: they deliver what they have in flight first). One that dies
        meanwhile is one line: the checkpoint that follows matters more, and a resume generates its
        unfinished prompts again (the ledger does not hold them)."""
        calls = {i: self.actors[i].stop.remote(drain, timeout_s) for i in self.live}
        for i, call in calls.items():
            try:
                self._get(call)
            except Exception as e:  # noqa: BLE001 - dead or failing: the run ends either way
                if self.serial or not isinstance(e, self._ray.exceptions.RayActorError):
                    raise
                self.log(f"[actor] {self.actor_named(i)} died while stopping ({type(e).__name__}); the prompts it "
                         "had in flight are not in the checkpoint: a --resume generates them again")

    def shutdown(self) -> None:
        for i, a in enumerate(self.actors):
            self._close(a, f"actor {i}", timeout_s=60)
        for r, h in enumerate(self.ranks):
            self._close(h, f"learner rank {r}", timeout_s=30)
        if not self.serial and self._ray.is_initialized():
            self._ray.shutdown()

    def _close(self, handle, role: str, timeout_s: float) -> None:
        """Close one role. A role whose process is gone has nothing to close, and its death was said when
        it was found: nothing more is said (Ray's account of it is an 8-line block). Any other failure
        is one line."""
        try:
            self._get(handle.close.remote(), timeout=timeout_s) if not self.serial else handle.close.remote()
        except Exception as e:  # noqa: BLE001 - shutting down: report and go on
            if self.serial or not isinstance(e, self._ray.exceptions.RayActorError):
                self.log(f"[graph] closing {role} failed ({first_line(e)})")  # not Ray's: its first line names the call
