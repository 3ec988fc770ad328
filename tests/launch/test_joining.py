"""How the actors join a run (`launch.processes.joining`, `ProcessGraph`'s starts and weight-sync connect),
decided without Ray or GPUs: a stand-in for Ray completes the calls in the order they were made.

- Engines sharing a GPU (rollout.gpus_per_actor a fraction) start one after another (review gpu_path_2 N6:
  vLLM profiles the GPU's memory while it starts and assumes no other process changes it meanwhile).
- A weight-sync group that does not form stops the run with one line of ours naming the role, its error
  and what to check, not Ray's traceback (N1)."""

from pathlib import Path

import pytest

from configs.loading import resolve
from launch.processes.joining import EngineStarts, start_chains
from launch.processes.process_graph import ProcessGraph, RoleLost, WeightSyncUnformed


class Ref:
    def __init__(self, value=None, error: BaseException | None = None, done: bool = True):
        self.value, self.error, self.done = value, error, done


class FakeRay:
    """`wait` hands back the oldest unfinished call first (each call finishes when it is waited for);
    `get` gives a call's value or raises its error. Every start and finish is logged."""

    class exceptions:  # noqa: N801 - Ray's namespace
        class RayActorError(Exception):
            pass

    def __init__(self):
        self.log: list[str] = []
        self.refs: list[Ref] = []

    def ref(self, what: str, value=None, error=None, done=True) -> Ref:
        self.log.append(f"call {what}")
        r = Ref(value, error, done)
        r.what = what
        self.refs.append(r)
        return r

    def wait(self, refs, num_returns=1, timeout=None):
        if timeout == 0:
            ready = [r for r in refs if r.done]
        else:
            ready = sorted(refs, key=self.refs.index)[:num_returns]
            for r in ready:
                if not r.done:
                    r.done = True
                    self.log.append(f"up {r.what}")
        return ready, [r for r in refs if r not in ready]

    def get(self, refs, timeout=None):
        if isinstance(refs, list):
            return [self.get(r) for r in refs]
        if refs.error is not None:
            raise refs.error
        return refs.value


class Call:
    def __init__(self, fn):
        self.remote = fn


class Actor:
    def __init__(self, ray: FakeRay, i: int, gpu: tuple | None = None, join_error: BaseException | None = None):
        self.start = Call(lambda: ray.ref(f"start {i}", value=1000 + i, done=False))
        self.gpu = Call(lambda: ray.ref(f"gpu {i}", value=gpu))
        self.connect_weight_sync = Call(lambda host, port, token: ray.ref(f"join {i}", error=join_error,
                                                                          done=join_error is not None))
        self.follow_weight_updates = Call(lambda: ray.ref(f"follow {i}"))


def test_actors_sharing_a_gpu_form_one_start_chain():
    a, b = ("node-1", ("0",)), ("node-1", ("1",))
    assert start_chains([a, a, None, b, a]) == [[0, 1, 4], [2], [3]]
    assert start_chains([None, None]) == [[0], [1]]


def _graph(ray: FakeRay, overrides: list[str], actors: list[Actor]) -> ProcessGraph:
    graph = ProcessGraph.__new__(ProcessGraph)  # only what the actors' calls use
    graph.cfg = resolve("grpo", overrides=overrides)
    graph.serial, graph._ray, graph.actors, graph.log_dir = False, ray, actors, Path("runs/a/logs")
    graph.live = list(range(len(actors)))
    graph._where, graph.pids, graph.log, graph._actors_since = {}, [], lambda line: None, 0.0
    return graph


def test_engines_sharing_a_gpu_start_one_after_another_the_others_at_once():
    """4 actors at 0.5 GPU on one node with 2 GPUs, as Ray placed them: actors 0 and 2 on GPU 0, 1 and 3 on
    GPU 1. Actor 2's start is called only once actor 0's engine is up, actor 3's once actor 1's is; the
    two GPUs' first engines start together. At whole GPUs every start is called at once (no GPU asked)."""
    ray = FakeRay()
    gpus = [("n", ("0",)), ("n", ("1",)), ("n", ("0",)), ("n", ("1",))]
    graph = _graph(ray, ["rollout.gpus_per_actor=0.5", "rollout.engine.gpu_memory_utilization=0.4", "rollout.num_actors=4"],
                   [Actor(ray, i, gpus[i]) for i in range(4)])
    graph._starting = graph._start_engines([0, 1, 2, 3])
    graph.await_actors()
    starts = [e for e in ray.log if not e.startswith("call gpu")]
    assert starts == ["call start 0", "call start 1", "up start 0", "call start 2", "up start 1", "call start 3",
                      "up start 2", "up start 3"]
    assert graph.pids == [1000, 1001, 1002, 1003]

    ray = FakeRay()
    graph = _graph(ray, ["rollout.gpus_per_actor=1"], [Actor(ray, i) for i in range(3)])
    starts = graph._start_engines([0, 1, 2])
    assert ray.log == ["call start 0", "call start 1", "call start 2"]
    assert starts.wait() == {0: 1000, 1: 1001, 2: 1002}


def test_a_chain_of_replacements_keeps_their_actor_numbers():
    ray = FakeRay()
    graph = _graph(ray, ["rollout.gpus_per_actor=0.25", "rollout.engine.gpu_memory_utilization=0.2"], [Actor(ray, i, ("n", ("0",))) for i in range(3)])
    graph.pids = [1, 2, 3]
    starts = EngineStarts(ray, [2, 0], lambda i: graph.actors[i].start.remote(), [("n", "0"), ("n", "0")])
    assert starts.wait() == {2: 1002, 0: 1000}
    assert ray.log == ["call start 2", "up start 2", "call start 0", "up start 0"]


class RayTaskError(Exception):
    """What Ray raises for a remote call's failure: its message is a traceback, its `cause` the error."""

    def __init__(self, cause: BaseException):
        super().__init__(f"ray::ActorRole.connect_weight_sync()\nTraceback (most recent call last):\n  ...\n{cause!r}")
        self.cause = cause


class Rank:
    def __init__(self, ray: FakeRay):
        self.reset_sender = Call(lambda n, token: ray.ref("reset_sender", value=("10.0.0.1", 29500)))
        self.connect_sender = Call(lambda: ray.ref("connect_sender", done=False))
        self.where = Call(lambda: ray.ref("where", value={"pid": 7, "host": "a"}))


def test_a_weight_sync_group_that_does_not_form_is_one_line_naming_the_actor():
    """The review's two-host reproduction: gloo's connect from host B to 127.0.0.1 was refused, and the
    console showed Ray's traceback. Now: a `RoleLost` (the launcher prints its one line and how to go on)
    naming the actor that failed, its process and log, the error's own line, and the fix."""
    ray = FakeRay()
    refused = RayTaskError(RuntimeError("Connection refused: connect to 127.0.0.1:41523 (gloo)\nmore detail"))
    graph = _graph(ray, [], [Actor(ray, 0), Actor(ray, 1, join_error=refused)])
    graph.ranks, graph.pids = [Rank(ray)], [4242, 4343]
    graph._where = {"actor/1": {"pid": 4343, "host": "host-b"}}
    graph._weight_sync_token = "t" * 64
    with pytest.raises(WeightSyncUnformed) as e:
        graph.connect_weight_sync()
    assert isinstance(e.value, RoleLost)  # launch.commands.supervisor: one line, exit status 1
    assert str(e.value) == (
        "[graph] the weight-sync group did not form: actor 1 (pid 4343 on host-b; log runs/a/logs/actor-1.log) "
        "failed (RuntimeError: Connection refused: connect to 127.0.0.1:41523 (gloo)) — every actor's node must "
        "reach learner rank 0 at 10.0.0.1:29500: check GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME of each node's "
        "`ray start` and the firewalls, and run `algo-train doctor` with the same flags")
