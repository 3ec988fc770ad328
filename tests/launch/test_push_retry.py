"""A weight push that fails with no actor to blame (review gpu_path_3 F3: a transport hang, every heartbeat alive,
every engine core answering) is retried once as a rebuilt group plus a dense push of the current version before
the run stops, with one console line either way. Stand-in process graph of tests/launch/test_actor_recovery.py and
a real buffer process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from configs.schema import RunConfig
from launch.loop.driver import Driver
from tests.launch.test_actor_recovery import StandInGraph, buffer  # noqa: F401 - `buffer` is a fixture

ERROR = "weight push #3 failed: NCCL broadcast of version 3 (push #3) did not finish within its 212.0 s deadline"


def driver_on(graph, tmp_path, address, said):
    return Driver(RunConfig(), graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, address,
                  SimpleNamespace(message=said.append))


def fail_finish(graph):
    def finish_push(watch=None):
        graph.calls.append(("finish",))
        raise RuntimeError(ERROR)

    graph.finish_push = finish_push


def test_a_push_nobody_can_be_blamed_for_is_retried_once_on_a_rebuilt_group(buffer, tmp_path):  # noqa: F811
    graph, said = StandInGraph(buffer), []
    fail_finish(graph)
    driver = driver_on(graph, tmp_path, buffer, said)
    try:
        driver.position.step = 3
        assert driver._sync_weights() == {}  # the run goes on: both actors got version 3 on a new group
        assert graph.calls[:4] == [("finish",), ("probe",), ("connect", [0, 1]), ("push", 3)]
        assert not any(c[0] in ("kill", "begin") for c in graph.calls)  # no actor was replaced
        lines = [m for m in said if m.startswith("[weights]")]
        assert lines == [f"[weights] a weight push failed and no actor is to blame (RuntimeError: {ERROR}); the weight-sync group "
                         "was rebuilt and version 3 pushed dense to 2 actor(s): the run goes on"]
    finally:
        driver.client.close()


def test_a_push_that_fails_again_on_the_rebuilt_group_stops_the_run_with_one_line(buffer, tmp_path):  # noqa: F811
    graph, said = StandInGraph(buffer), []
    fail_finish(graph)

    def push_weights(version):
        graph.calls.append(("push", version))
        raise RuntimeError("weight push #1 failed: NCCL broadcast of version 3 (push #1) did not finish")

    graph.push_weights = push_weights
    driver = driver_on(graph, tmp_path, buffer, said)
    try:
        driver.position.step = 3
        with pytest.raises(RuntimeError, match=r"weight push #1 failed"):
            driver._sync_weights()
        assert [c for c in graph.calls if c[0] in ("connect", "push")] == [("connect", [0, 1]), ("push", 3)]
        lines = [m for m in said if m.startswith("[weights]")]
        assert lines == [f"[weights] a weight push failed and no actor is to blame (RuntimeError: {ERROR}); the weight-sync group "
                         "was rebuilt and version 3 pushed dense, which failed too (RuntimeError: weight push #1 failed: NCCL "
                         "broadcast of version 3 (push #1) did not finish): the run stops"]
    finally:
        driver.client.close()
