"""The driver's recovery from a dead actor, against a real buffer process and a stand-in process graph
(the whole thing, with Ray and vLLM, is `tests/e2e/test_fleet_e2e.py`): what the successor
skips (the ledger: trained, discarded, held), that the dead actor's credit is released, that the
successor starts in the background while the others' weight sync is re-formed and training goes on,
the order of admission (engine up -> weight-sync group -> push -> rollouts), that a weight push failed by
a dead actor restarts it, and that the next version's push starts only after the previous one has landed."""

from __future__ import annotations

import json
import pickle
import signal
from types import SimpleNamespace

import pytest

from buffer.client import BufferClient
from buffer.process import start_buffer_process
from configs.schema import RunConfig
from launch.loop.driver import Driver
from launch.processes.process_graph import RoleLost
from launch.processes.roles import named
from tests.buffer.helpers import make_group
from weightsync.protocol import WeightSyncError


class StandInGraph:
    """Answers like `launch.processes.process_graph.ProcessGraph` for two actors and records what the driver asks."""

    def __init__(self, buffer: str):
        self.buffer, self.last_words = buffer, {}
        self.delivered: dict[int, list] = {}  # actor -> [(wall time, key)] the buffer acknowledged
        self.actors, self.pids, self.restarts = [object(), object()], [100, 101], 0
        self.live, self.replacing, self.engines_up, self.start_error = [0, 1], [], False, None
        self.shards = 2
        self.silent: dict[int, str] = {}  # actors whose engine core does not answer (`silent_engines`)
        self.calls: list[tuple] = []
        self.dead: dict[int, str] = {}
        self.fail_next_push = False
        self.reports = {0: {"actor_id": 0}, 1: {"actor_id": 1}}

    def actor_stats(self):
        dead = {i: why for i, why in self.dead.items() if i in self.live}
        return {i: r for i, r in self.reports.items() if i in self.live and i not in dead}, dead

    def start_push(self, version):
        self.calls.append(("start", version))

    def finish_push(self, watch=None):
        self.calls.append(("finish",))
        if self.fail_next_push:
            self.fail_next_push = False
            raise RuntimeError("weight push #3 failed: broadcast failed: Connection closed by peer")
        return {"gbps": 1.0}

    def push_weights(self, version):
        self.calls.append(("push", version))
        return {"gbps": 1.0}

    def check_learner(self):
        pass

    def silent_engines(self):
        self.calls.append(("probe",))
        return dict(self.silent)

    def save(self, path, extra_state):
        self.saved = extra_state

    def kill_actors(self, ids):
        self.calls.append(("kill", sorted(ids)))
        for i in ids:  # an actor declared dead by a slow health check delivers its last group as it dies
            for epoch, prompt in self.last_words.pop(i, []):
                with BufferClient(self.buffer, f"actor-{i}") as dying:
                    assert dying.push_group(make_group(f"last-{prompt}", prompt_index=prompt,
                                                       meta={"epoch": epoch})).accepted

    def begin_replacing(self, ids, skip, version):
        self.calls.append(("begin", ids, skip, version))
        self.live = [i for i in self.live if i not in ids]
        self.replacing += ids
        self.restarts += len(ids)

    def poll_replacements(self, timeout_s=0.0):
        if not self.engines_up:
            return {}, {}
        ids, self.replacing = self.replacing, []
        if self.start_error is not None:
            return {}, {i: self.start_error for i in ids}
        for i in ids:
            self.pids[i] += 10
        return {i: self.pids[i] for i in ids}, {}

    def admit(self, ids):
        self.live = sorted(set(self.live) | set(ids))

    def begin_adding(self, count, version):
        ids = list(range(len(self.actors), len(self.actors) + count))
        self.calls.append(("add", ids, version))
        self.actors += [object()] * count
        self.pids += [190 + i for i in ids]  # poll adds 10: actor 2 is up as pid 202
        self.replacing += ids
        return ids

    def remove_actors(self, ids):
        self.calls.append(("remove", ids))
        keep = len(self.actors) - len(ids)
        self.actors, self.pids, self.live = self.actors[:keep], self.pids[:keep], [i for i in self.live if i < keep]
        self.replacing = [i for i in self.replacing if i < keep]

    def reshard(self, n, skip):
        self.calls.append(("reshard", list(self.live), n, sorted(skip)))
        self.shards = n

    def stop_actors(self, drain, timeout_s):
        self.calls.append(("stop", list(self.live), drain))

    def delivered_since(self, wall_time):
        self.calls.append(("delivered_since", wall_time))
        return {i: [k for t, k in keys if t >= wall_time] for i, keys in self.delivered.items()}

    def requeue(self, keys_by_actor):
        self.calls.append(("requeue", keys_by_actor))

    def where(self):
        return {f"actor/{i}": {"pid": self.pids[i], "host": "here"} for i in self.live}

    def actor_named(self, i):
        return named(f"actor {i}", self.pids[i], "here", f"logs/actor-{i}.log")

    def connect_weight_sync(self):
        self.calls.append(("connect", list(self.live)))

    def start_rollouts(self, which=None):
        self.calls.append(("rollouts", which))


@pytest.fixture
def buffer():
    proc, address = start_buffer_process(None, batch_prompts=2, max_staleness=1)
    yield address
    proc.terminate()
    proc.join(10)


def test_a_push_failed_by_a_dead_actor_is_replaced_in_the_background_while_training_goes_on(buffer, tmp_path):
    with BufferClient(buffer, "actor-1") as dead_actor:  # before it died, actor 1 ...
        assert dead_actor.request_credit(2, 0).granted == 2
        assert dead_actor.push_group(make_group("a1-1", prompt_index=5, meta={"epoch": 0})).accepted  # delivered (0, 5)
    graph, said = StandInGraph(buffer), []
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=said.append))
    try:
        assert driver.client.stats()["credits_outstanding"] == 1  # ... and held one unit it never used
        driver.position.ledger.record(0, [(0, 1), (0, 3)])
        driver.position.step = 1  # = version 1
        assert driver.recovery.check_actors() == {}  # all alive: their reports are kept
        graph.dead, graph.fail_next_push = {1: "process gone: ActorDiedError"}, True

        assert driver._sync_weights() == {}  # the push in flight failed: the live actor was re-synced to version 1

        finish, kill, (_, ids, skip, version), *rest = graph.calls
        assert finish == ("finish",) and kill == ("kill", [1]) and version == 1 and ids == [1]
        # the successor starts in the background; actor 0 alone gets a new group and version 1, and goes on
        assert rest == [("connect", [0]), ("push", 1)] and graph.replacing == [1]
        assert set(skip) == {(0, 1), (0, 3), (0, 5)}  # trained, trained, held by the buffer: the rest is redone
        assert driver.client.stats()["credits_outstanding"] == 0  # the dead actor's credit was released
        # one line: the actor, its process, host and log, and what the run did (the push's error adds none)
        assert [m for m in said if m.startswith("[actor]")] == [said[-1]]
        assert said[-1] == ("[actor] actor 1 (pid 101 on here; log logs/actor-1.log) died (process gone: "
                            "ActorDiedError); its successor starts in the background and training goes on with "
                            "the other 1 actor(s); its shard resumes past the 3 prompts trained, discarded or "
                            "buffered")
        assert json.loads((tmp_path / "processes.json").read_text()).keys() >= {"actor/0"}
        assert "actor/1" not in json.loads((tmp_path / "processes.json").read_text())

        graph.calls = []  # the next step: its engine is not up yet, so the push goes to actor 0 alone
        assert driver._sync_weights() == {"gbps": 1.0}
        assert graph.calls == [("finish",), ("start", 1)]

        graph.calls, graph.engines_up = [], True  # up: it joins at the next push, then generates
        driver.position.step = 2
        assert driver._sync_weights() == {"gbps": 1.0}
        assert graph.calls == [("finish",), ("finish",), ("connect", [0, 1]), ("push", 2), ("rollouts", [1])]
        assert said[-1].startswith("[actor] actor 1 restarted as pid 111 and joined at version 2 in ")
        assert said[-1].endswith("s (training went on meanwhile)")
        assert json.loads((tmp_path / "processes.json").read_text())["actor/1"] == {"pid": 111, "host": "here"}

        graph.calls = []
        assert driver._sync_weights() == {"gbps": 1.0}  # the previous push's stats; this version's starts
        assert graph.calls == [("finish",), ("start", 2)]

        graph.dead, graph.fail_next_push, graph.calls = {}, True, []
        assert driver._sync_weights() == {}  # no actor to blame: retried once on a rebuilt group (tests/launch/test_push_retry.py)
        assert graph.calls == [("finish",), ("probe",), ("connect", [0, 1]), ("push", 2)]
    finally:
        driver.client.close()


def test_a_successor_whose_engine_fails_to_start_stops_the_run_with_one_line(buffer, tmp_path):
    graph = StandInGraph(buffer)
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=lambda m: None))
    try:
        graph.dead = {0: "its vLLM engine died"}
        driver.recovery.check_actors()
        graph.engines_up, graph.start_error = True, RuntimeError("CUDA out of memory\n(traceback)")
        with pytest.raises(RoleLost, match=r"^\[actor\] the successor of actor 0 did not start \(RuntimeError: "
                                           r"CUDA out of memory\); the run stopped$"):
            driver.recovery.admit_successors()
    finally:
        driver.client.close()


def test_a_successor_skips_prompts_the_buffer_discarded_as_well_as_trained_ones(buffer, tmp_path):
    """Prompt progress has one owner: a group the buffer drops (here: stale on arrival) settles its prompt
    as training would. The pull that follows reports its key, the ledger records it, and a restarted
    actor skips it -- with no report of its own about where it was."""
    graph, cfg = StandInGraph(buffer), RunConfig()
    cfg.learner.batch_prompts = 2  # the buffer's batch
    driver = Driver(cfg, graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=lambda m: None))
    try:
        driver.client.set_version(2)
        driver.position.step = 2
        with BufferClient(buffer, "actor-0") as actor:
            assert actor.push_group(make_group("old", prompt_index=9, version=0, meta={"epoch": 1})).reason == "stale"
            for i in (2, 4):
                assert actor.push_group(make_group(f"g{i}", prompt_index=i, version=2, meta={"epoch": 1})).accepted
        groups, _ = driver._pull()
        assert sorted(g.prompt_index for g in groups) == [2, 4] and driver.position.ledger.discarded == {(1, 9)}
        driver.position.ledger.record(2, [(1, 2), (1, 4)])
        graph.dead = {0: "its vLLM engine died"}
        assert driver.recovery.check_actors() == {0: "its vLLM engine died"}
        kill, (_, ids, skip, _), *_ = graph.calls
        assert kill == ("kill", [0]) and ids == [0]  # stopped before its successor's plan is made
        assert skip == [(1, 2), (1, 4), (1, 9)]  # trained, trained, discarded
        state = driver.position.ledger.state_dict()  # a checkpoint keeps the discarded keys too
        assert type(driver.position.ledger).from_state_dict(json.loads(json.dumps(state))).accepted() == skip
    finally:
        driver.client.close()


def test_an_actor_declared_dead_is_killed_before_its_successor_plan_is_made(buffer, tmp_path):
    """The restart race: a health check that timed out declares actor 1 dead while it still runs, and it
    delivers prompt (0, 7) before it dies. Planned before the kill (the old order), the plan missed
    (0, 7) though the buffer holds it: generated again and trained twice. Killed first, the plan sees
    it held, so it is skipped."""
    graph = StandInGraph(buffer)
    graph.last_words = {1: [(0, 7)]}
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=lambda m: None))
    try:
        assert driver.recovery.check_actors() == {}  # it has (0, 7) in flight
        graph.dead = {1: "no answer within 30s"}
        driver.recovery.check_actors()
        skip = graph.calls[1][2]
        assert (0, 7) in skip  # delivered as it died: held by the buffer, so not generated again
    finally:
        driver.client.close()


def test_an_actor_alive_but_stuck_in_a_push_is_restarted(buffer, tmp_path):
    """The health check finds every actor alive, but the push names actor 0 (it never acknowledged):
    the error crosses Ray pickled, and the driver treats actor 0 as dead."""
    err = WeightSyncError("weight push #4 failed: no acknowledgement of version 2 within 60 s",
                          failed_ranks={1: "stuck"}, suspects={"actor-0": "no acknowledgement within 60 s"})
    err = pickle.loads(pickle.dumps(err))  # what Ray does between the learner rank and the driver
    assert err.suspects == {"actor-0": "no acknowledgement within 60 s"} and err.failed_ranks == {1: "stuck"}

    graph = StandInGraph(buffer)
    graph.finish_push = lambda watch=None: _raise(err)
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=lambda m: None))
    try:
        driver.position.step = 2  # = version 2
        assert driver._sync_weights() == {}
        kill, (_, ids, _, version), *rest = graph.calls
        assert kill == ("kill", [0]) and ids == [0] and version == 2
        assert rest == [("connect", [1]), ("push", 2)]
    finally:
        driver.client.close()


def _raise(err):
    raise err


def test_an_actor_that_dies_while_another_is_restarted_is_restarted_too(buffer, tmp_path):
    """Actor 0 died; while the others' weight-sync group is re-formed without it, actor 1 dies too (the
    group fails on it: Ray's ActorDiedError). Both are replaced in the background; with no actor live the
    group is closed (connect with none) and pushes go nowhere. Once their engines are up both join one
    group, get the current version and only then generate; one line per death and per join (the error
    ended the run once)."""
    graph, said = StandInGraph(buffer), []
    connects = []

    def connect_weight_sync():
        connects.append(len(connects))
        graph.calls.append(("connect", list(graph.live)))
        if len(connects) == 1:
            graph.dead = {1: "process gone: ActorDiedError"}
            raise RuntimeError("ray.exceptions.ActorDiedError: The actor died unexpectedly (actor 1)")

    graph.connect_weight_sync = connect_weight_sync
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=said.append))
    try:
        driver.position.ledger.record(0, [(0, 2)])
        driver.position.step = 1
        graph.dead = {0: "process gone: ActorDiedError"}
        assert driver.recovery.check_actors() == {0: "process gone: ActorDiedError"}
        assert [c[:2] for c in graph.calls] == [("kill", [0]), ("begin", [0]), ("connect", [1]), ("kill", [1]),
                                                ("begin", [1]), ("connect", []), ("push", 1)]
        assert [c[2] for c in graph.calls if c[0] == "begin"] == [[(0, 2)], [(0, 2)]]
        lines = [m for m in said if m.startswith("[actor]")]
        assert [m.split(" died ")[0] for m in lines] == ["[actor] actor 0 (pid 100 on here; log logs/actor-0.log)",
                                                        "[actor] actor 1 (pid 101 on here; log logs/actor-1.log)"]
        assert "training goes on with the other 1 actor(s)" in lines[0]
        assert "no actor generates until it is up" in lines[1]

        graph.calls, graph.engines_up, graph.dead = [], True, {}
        assert driver.recovery.admit_successors() is True
        assert graph.calls == [("finish",), ("connect", [0, 1]), ("push", 1), ("rollouts", [0, 1])]
        lines = [m for m in said if m.startswith("[actor]")][2:]
        assert [m.split(" and joined")[0] for m in lines] == ["[actor] actor 0 restarted as pid 110",
                                                             "[actor] actor 1 restarted as pid 111"]
        roles = json.loads((tmp_path / "processes.json").read_text())
        assert (roles["actor/0"]["pid"], roles["actor/1"]["pid"]) == (110, 111)
    finally:
        driver.client.close()


def _ask(run_dir, actors: int) -> None:
    import os
    import time

    from launch.state.scaling import REQUEST, write_request

    write_request(run_dir, actors)
    later = time.time() + 1  # a request is new when its file is: the next one is a second later here
    os.utime(run_dir / REQUEST, (later, later))


def test_a_scale_up_starts_actors_in_the_background_and_they_join_together_on_new_shards(buffer, tmp_path):
    """2 -> 4 actors: actors 2 and 3 start while training goes on; actor 2 up alone does not join; once
    both are up, every live actor delivers what it has in flight (stop with drain), all four take shards
    i::4 walked past what the ledger and the buffer account for, then one group and one push, then all
    generate. Then 4 -> 1: the drain, actors 1-3 leave (killed, their credit released), actor 0 takes i::1."""
    graph, said = StandInGraph(buffer), []
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=said.append))
    try:
        driver.position.ledger.record(0, [(0, 1), (0, 2)])
        driver.position.step = 1
        driver.recovery.follow_scale_requests()
        assert graph.calls == []  # no request: nothing
        _ask(tmp_path, 4)
        driver.recovery.follow_scale_requests()
        assert graph.calls == [("add", [2, 3], 1)] and graph.live == [0, 1]
        assert said[-1] == "[scale] asked for 4 actors: actors 2, 3 start in the background and training goes on with 2"
        driver.recovery.follow_scale_requests()  # the same request is not taken up twice
        assert graph.calls == [("add", [2, 3], 1)]

        graph.calls, graph.engines_up, graph.replacing = [], True, [2]  # actor 2 is up, actor 3 not yet
        assert driver.recovery.admit_successors() is False and graph.calls == [] and graph.live == [0, 1]
        graph.replacing = [3]
        driver.position.step = 2
        assert driver.recovery.admit_successors() is True
        assert graph.calls == [("finish",), ("stop", [0, 1, 2, 3], True), ("reshard", [0, 1, 2, 3], 4, [(0, 1), (0, 2)]),
                               ("connect", [0, 1, 2, 3]), ("push", 2), ("rollouts", [0, 1, 2, 3])]
        assert said[-1].startswith("[scale] actors 2, 3 joined (pids 202, 203) at version 2 in ")
        assert said[-1].endswith("s: the run has 4 actors, each on shard i::4")

        with BufferClient(buffer, "actor-3") as leaver:  # credit the leaver holds is released when it goes
            assert leaver.request_credit(1, 0).granted == 1
        graph.calls = []
        _ask(tmp_path, 1)
        driver.recovery.follow_scale_requests()
        assert graph.calls == [("finish",), ("stop", [0, 1, 2, 3], True), ("remove", [1, 2, 3]),
                               ("reshard", [0], 1, [(0, 1), (0, 2)]), ("connect", [0]), ("push", 2), ("rollouts", None)]
        assert driver.client.stats()["credits_outstanding"] == 0
        assert said[-1].startswith("[scale] asked for 1 actors: actors 1, 2, 3 left after delivering what they had "
                                   "in flight, in ")
        assert json.loads((tmp_path / "processes.json").read_text()).keys() >= {"actor/0"}
    finally:
        driver.client.close()


def test_a_scale_up_whose_actors_cannot_start_is_cancelled_and_the_run_goes_on(buffer, tmp_path):
    from launch.planning.resources import ResourceError

    graph, said = StandInGraph(buffer), []
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=said.append))
    try:
        _ask(tmp_path, 3)
        driver.recovery.follow_scale_requests()
        graph.engines_up, graph.start_error = True, ResourceError("Ray could not place 1 more actor(s) within 600 s")
        assert driver.recovery.admit_successors() is False  # no RoleLost: the run keeps its 2 actors
        assert graph.calls[-1] == ("remove", [2]) and len(graph.actors) == 2
        assert said[-1] == ("[scale] the scale-up to 3 actors was cancelled (ResourceError: Ray could not place 1 "
                            "more actor(s) within 600 s); the run stays at 2 actors")
    finally:
        driver.client.close()


def test_a_request_written_before_the_run_started_is_not_taken_up(buffer, tmp_path):
    from launch.state.scaling import write_request

    write_request(tmp_path, 5)  # left by an earlier incarnation of the run: a resume's --actors decides
    graph = StandInGraph(buffer)
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=lambda m: None))
    try:
        driver.recovery.follow_scale_requests()
        assert graph.calls == []
    finally:
        driver.client.close()


def test_a_checkpoint_records_what_the_buffer_discarded_since_the_last_pull(buffer, tmp_path):
    """The buffer hands its discarded keys over with the next pull; a final checkpoint has no next pull, so
    keys discarded after the last one were in neither its ledger nor its snapshot (the chaos bench's try-out
    counted 5 such prompts as lost). The checkpoint asks the buffer for them first."""
    graph = StandInGraph(buffer)
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=lambda m: None))
    try:
        driver.client.set_version(2)
        driver.position.step = 2
        with BufferClient(buffer, "actor-0") as actor:
            assert actor.push_group(make_group("old", prompt_index=9, version=0, meta={"epoch": 1})).reason == "stale"
        driver.checkpoints.save()
        assert graph.saved["ledger"] == driver.position.ledger.state_dict()
        assert driver.position.ledger.discarded == {(1, 9)}
    finally:
        driver.client.close()


def test_a_driver_starved_by_a_failed_push_settles_it_and_the_actors_feed_it_again(buffer, tmp_path, monkeypatch):
    """The extended chaos run hung here: an engine stopped (SIGSTOP) during a push, the push failed at its
    deadline and left every engine without a version, so no actor generated and no batch came; the failed
    push was settled only after the next step, which waited for a batch. Starved, the driver now settles it:
    the stuck actor is replaced, the other re-synced, and the batch comes."""
    import launch.loop.driver as driver_module

    monkeypatch.setattr(driver_module, "PULL_POLL_S", 0.5)
    graph = StandInGraph(buffer)
    cfg = RunConfig()
    cfg.learner.batch_prompts = 2
    driver = Driver(cfg, graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=lambda m: None))

    def push_weights(version):  # the survivor, re-synced, serves a version again and delivers
        graph.calls.append(("push", version))
        with BufferClient(buffer, "actor-1") as actor:
            for i in (1, 3):
                assert actor.push_group(make_group(f"g{i}", prompt_index=i, version=version, meta={"epoch": 0})).accepted

    graph.push_weights = push_weights
    try:
        driver.position.step = 1
        driver.client.set_version(1)
        failures = [WeightSyncError("no acknowledgement of version 1 within 60 s",  # the push in flight:
                                    suspects={"actor-0": "no acknowledgement within 60 s"})]  # actor 0 stopped
        graph.finish_push = lambda watch=None: _raise(failures.pop()) if failures else {}
        signal.signal(signal.SIGALRM, lambda *_: _raise(AssertionError("starved for good: the failed push was "
                                                                       "never settled")))
        signal.alarm(30)  # (the old driver waited here for ever)
        try:
            groups, _ = driver._pull()
        finally:
            signal.alarm(0)
        assert sorted(g.prompt_index for g in groups) == [1, 3]
        assert [c[:2] for c in graph.calls] == [("kill", [0]), ("begin", [0]), ("connect", [1]), ("push", 1)]
    finally:
        driver.client.close()


def test_a_push_that_names_no_receiver_blames_the_actor_whose_engine_core_does_not_answer(buffer, tmp_path):
    """The extended chaos run stopped here (exit 1): actor 0's engine core was SIGSTOPped during a gloo push, every
    receiver's broadcast timed out, and the push named no receiver; every actor answered its health check. The
    engine that does not answer a call is the cause: replaced, and the run goes on."""
    graph = StandInGraph(buffer)
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=lambda m: None))
    try:
        driver.position.step = 3
        graph.fail_next_push, graph.silent = True, {0: "its engine core did not answer within 10 s"}
        assert driver._sync_weights() == {}
        assert [c[:2] for c in graph.calls] == [("finish",), ("probe",), ("kill", [0]), ("begin", [0]),
                                                ("connect", [1]), ("push", 3)]
    finally:
        driver.client.close()


def test_an_actor_dead_while_a_push_is_awaited_is_replaced_without_waiting_for_the_push_to_give_up(buffer, tmp_path):
    """The per-fault table showed 12 s of learner idle after an actor's SIGKILL: the driver waited for the push
    in flight until it gave the dead receiver up (no heartbeat for 10 s). The wait now watches the actors."""
    graph, said = StandInGraph(buffer), []
    watched = []

    def finish_push(watch=None):  # the push still travels; the health check inside the wait finds actor 1 dead
        graph.calls.append(("finish",))
        graph.dead = {1: "process gone: ActorDiedError"}
        watched.append(watch)
        watch()
        raise AssertionError("the wait should have ended at the health check")

    graph.finish_push = finish_push
    driver = Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, buffer,
                    SimpleNamespace(message=said.append))
    try:
        driver.position.step = 4
        assert driver._sync_weights() == {}
        assert [c[:2] for c in graph.calls] == [("finish",), ("kill", [1]), ("begin", [1]), ("connect", [0]),
                                                ("push", 4)]
        assert said[-1].startswith("[actor] actor 1 (pid 101 on here; log logs/actor-1.log) died (process gone")
    finally:
        driver.client.close()
