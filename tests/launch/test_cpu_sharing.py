"""One CPU machine: learner ranks on cores of their own (`plan_rank_cores`); the actors are not pinned, so a
core the learner leaves idle generates (measured against a lower actor priority: bench/RESULTS.md, "CPU
sharing on one machine")."""

from __future__ import annotations

from launch.planning.placement import plan_rank_cores


def test_ranks_take_whole_cores_from_the_top_and_share_the_last_one_when_they_run_out():
    assert plan_rank_cores(1, 1.0, cores=[0, 1]) == [[1]]  # the quick-start: the learner on core 1
    assert plan_rank_cores(2, 0.5, cores=[0, 1]) == [[1], [0]]  # a half-core rank still gets a whole core
    assert plan_rank_cores(2, 2.0, cores=list(range(8))) == [[6, 7], [4, 5]]
    assert plan_rank_cores(3, 1.0, cores=[0, 1]) == [[1], [0], [0]]  # more ranks than cores: the last core shared
