"""How the driver sees its roles' health, with real Ray and real processes killed; the roles are
stand-ins with the roles' method names (whole learners and engines would only make the tests slower).

- A learner rank whose process dies ends the run with one line naming the rank, its process and how
  to read its output (`launch.processes.process_graph.LearnerDied`); closing the dead rank says nothing more, any
  other failure to close a role is one line (not Ray's traceback).
- The actors' health check asks every actor at once, under one deadline (`ray.wait`): a dead, a
  stuck and an engine-dead actor are told apart from the live one.
- The held-out evaluation is spread over every actor."""

from __future__ import annotations

import os
import re
import time

import pytest

from launch.processes.learner_ranks import LearnerDied
from launch.processes.process_graph import ProcessGraph
from launch.processes.roles import where


class Rank:
    def where(self) -> dict:
        return where()

    def step(self, groups, version: int) -> dict:
        return {"groups": len(groups), "version": version}

    def close(self) -> None:
        raise RuntimeError("the process group is gone\n(more of the error)")

    def reset_sender(self, receivers: int, token: str) -> tuple[str, int]:
        return "127.0.0.1", 1

    def connect_sender(self) -> None:
        os._exit(1)  # dies while the actors join its group


class Actor:
    def __init__(self, mode: str):
        self.mode = mode

    def pid(self) -> int:
        return os.getpid()

    def connect_weight_sync(self, host: str, port: int, token: str) -> None:
        time.sleep(2)
        raise TimeoutError("the weight-sync group did not form")  # what an actor says when the sender is gone

    def engine_answers(self, timeout_s: float) -> bool:
        return self.mode != "stopped core"  # its own process answers; its engine core would not

    def stop(self, drain: bool, timeout_s: float) -> None:
        self.stopped = (drain, timeout_s)

    def stats(self) -> dict:
        if self.mode == "stuck":
            time.sleep(60)
        return {"engine_dead": self.mode == "engine_dead", "pid": os.getpid()}


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_a_dead_learner_rank_stops_the_run_with_one_line_naming_it(ray_local):
    graph = ProcessGraph.__new__(ProcessGraph)  # only what the learner calls use
    said = []
    graph.serial, graph._ray, graph.actors, graph._where, graph.log_dir = False, ray_local, [], {}, None
    graph.log, graph.live = said.append, []
    graph.ranks = [ray_local.remote(Rank).options(num_cpus=0).remote() for _ in range(2)]
    assert graph.step([1, 2, 3], 4) == {"groups": 3, "version": 4}  # the batch travels as one object
    pid = graph.where()["learner/1"]["pid"]

    os.kill(pid, 9)
    with pytest.raises(LearnerDied) as e:
        graph.step([1], 5)
    # logging.verbose: no log file, so the line says how to read the rank's output (the line a run's
    # console shows, with its log file: tests/launch/test_fault_console.py)
    msg = str(e.value)
    assert re.fullmatch(rf"learner rank 1 \(pid {pid} on \S+; log `ray logs actor --id [0-9a-f]+`\) died "
                        r"\(process gone: ActorDiedError\)", msg), msg
    graph._close(graph.ranks[1], "learner rank 1", timeout_s=10)  # shutting down: the dead rank is not said again
    graph._close(graph.ranks[0], "learner rank 0", timeout_s=10)
    assert said == ["[graph] closing learner rank 0 failed (RuntimeError: the process group is gone)"]


def test_a_learner_rank_dying_while_the_actors_join_its_weight_sync_group_is_a_learner_death(ray_local):
    """(--max-restarts resumes a run stopped by LearnerDied; any other error ends it.)"""
    graph = ProcessGraph.__new__(ProcessGraph)
    graph.serial, graph._ray, graph._where, graph.log_dir = False, ray_local, {}, None
    graph._weight_sync_token = "t"
    graph.ranks = [ray_local.remote(Rank).options(num_cpus=0).remote()]
    graph.actors, graph.live = [ray_local.remote(Actor).options(num_cpus=0).remote("ok")], [0]
    with pytest.raises(LearnerDied, match=r"^learner rank 0 \(pid \? .*\) died \(process gone: "):
        graph.connect_weight_sync()
    ray_local.kill(graph.actors[0])


def test_the_health_check_asks_every_actor_at_once(ray_local):
    graph = ProcessGraph.__new__(ProcessGraph)
    graph.serial, graph._ray = False, ray_local
    modes = ["ok", "stuck", "dead", "engine_dead"]
    graph.actors = [ray_local.remote(Actor).options(num_cpus=0).remote(m) for m in modes]
    graph.live = [0, 1, 2, 3]
    # every actor process is up before the deadline starts (a worker's start-up under load took longer than
    # the 3 s deadline on CI), so only the stuck one can run out of it
    pids = ray_local.get([a.pid.remote() for a in graph.actors])
    os.kill(pids[2], 9)
    stats, dead = graph.actor_stats(timeout_s=3)
    assert list(stats) == [0] and dead == {1: "no answer within 3s", 2: "process gone: ActorDiedError",
                                           3: "its vLLM engine died"}
    for a in graph.actors:
        ray_local.kill(a)


def test_an_actor_dead_at_the_final_stop_is_one_line_and_the_others_still_drain(ray_local):
    """The final drain (`Driver._drain`) used to raise Ray's error for a dead actor, and the final checkpoint
    was never written."""
    graph, said = ProcessGraph.__new__(ProcessGraph), []
    graph.serial, graph._ray, graph.log, graph.log_dir = False, ray_local, said.append, None
    graph.actors = [ray_local.remote(Actor).options(num_cpus=0).remote("ok") for _ in range(2)]
    graph.live, graph.pids = [0, 1], ray_local.get([a.pid.remote() for a in graph.actors])
    graph._where = {"actor/0": {"host": "here"}}
    os.kill(graph.pids[0], 9)
    graph.stop_actors(drain=True, timeout_s=5)
    assert len(said) == 1 and re.fullmatch(
        rf"\[actor\] actor 0 \(pid {graph.pids[0]} on here; log `ray logs actor --id [0-9a-f]+`\) died while stopping "
        r"\(ActorDiedError\); the prompts it had in flight are not in the checkpoint: a --resume generates them "
        r"again", said[0]), said
    for a in graph.actors:
        ray_local.kill(a)


class Scorer:
    def __init__(self):
        self.got = []

    def evaluate(self, items) -> dict:
        self.got = list(items)
        return {"accuracy": sum(i % 2 for i in items) / len(items), "n": len(items),
                "per_prompt": [[i, float(i % 2)] for i in items]}


def test_evaluation_is_spread_over_the_live_actors_and_weighted_by_counts():
    from launch.processes.process_graph import LocalRole

    graph = ProcessGraph.__new__(ProcessGraph)
    scorers = [Scorer() for _ in range(3)]
    graph.serial, graph.actors, graph.live = True, [LocalRole(s) for s in scorers], [0, 1, 2]
    # items 0..6: actor 0 scores 0, 3, 6 (1 odd of 3), actor 1 scores 1, 4 (1 of 2), actor 2 scores 2, 5 (1 of 2)
    assert graph.evaluate(list(range(7))) == {"accuracy": 3 / 7, "n": 7,
                                              "per_prompt": [[i, float(i % 2)] for i in range(7)]}  # by index
    assert [s.got for s in scorers] == [[0, 3, 6], [1, 4], [2, 5]]
    assert graph.evaluate([5]) == {"accuracy": 1.0, "n": 1, "per_prompt": [[5, 1.0]]}  # the others idle
    graph.live = [0, 2]  # actor 1's successor is still starting: the live ones share its items
    assert graph.evaluate(list(range(5)))["accuracy"] == 2 / 5
    assert [s.got for s in scorers] == [[0, 2, 4], [1, 4], [1, 3]]  # actor 1 was not asked (its last items)



def test_a_wedged_engine_is_named_by_the_reason_its_actor_gives():
    from launch.processes.process_graph import engine_death

    assert engine_death({"engine_dead": True}) == "its vLLM engine died"
    assert engine_death({"engine_dead": "wedged: no token for 31 s and no answer in 8 s"}) == (
        "wedged: no token for 31 s and no answer in 8 s")


def test_engines_that_do_not_answer_are_asked_of_every_live_actor_at_once(ray_local):
    graph = ProcessGraph.__new__(ProcessGraph)
    graph.serial, graph._ray = False, ray_local
    graph.actors = [ray_local.remote(Actor).options(num_cpus=0).remote(m) for m in ("ok", "stopped core", "ok")]
    pids = ray_local.get([a.pid.remote() for a in graph.actors])
    os.kill(pids[2], 9)
    graph.live = [0, 1, 2]
    assert graph.silent_engines(timeout_s=1) == {1: "its engine core did not answer within 1 s",
                                                 2: "its engine core did not answer within 1 s"}  # 2: gone
    graph.live = []
    assert graph.silent_engines() == {}
    for a in graph.actors:
        ray_local.kill(a)
