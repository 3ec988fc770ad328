"""The driver's part of a metrics row (`launch.loop.metrics.step_row`), by hand, and the one-writer rule of
`merge_rows` (that the learner writes none of the driver's keys: tests/learner/test_learner_algos.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from launch.loop.metrics import StepTimes, merge_rows, step_row


def _sample(reward: float, finish: str, tokens: int):
    return SimpleNamespace(reward=reward, finish_reason=finish, tokens=np.zeros(tokens, np.int32),
                           truncated=finish == "length")


def _group(*samples):
    return SimpleNamespace(n=len(samples), samples=list(samples))


def test_a_step_row_by_hand():
    groups = [_group(_sample(1.0, "stop", 3), _sample(0.0, "length", 5)),
              _group(_sample(1.0, "stop", 4), _sample(1.0, "demo", 6))]  # a demonstration row: no accuracy
    times = StepTimes(wait_s=0.5, train_s=2.0, sync_s=0.25, since_last_s=3.0, wall_s=10.0)
    sync = {"gbps": 2.5, "seconds": 0.8, "bytes": 1000, "changed_frac": 0.5}
    buffer = {"dropped_stale": 3, "auth": {"refused": 9, "refused_peers": 1}, "occupancy_groups": 7, "filtered": {"all_0": 2, "all_1": 5},
              "generated_samples": 40, "generated_correct": 11}
    reports = [{"reward_errors": 2, "reward_timeouts": 1, "groups_no_version": 2, "sent_tokens": 300,
                "mixed_version_tokens": 30, "seqs_in_flight": 60.0, "seq_capacity": 200},
               {"reward_errors": 3, "sent_tokens": 100, "seqs_in_flight": 20.0, "seq_capacity": None,
                "requests_aborted": 5, "members_regenerated": 4, "groups_requeued": 1}]
    row = step_row(groups, times, sync, buffer, version=4, actor_restarts=1, buffer_restarts=2, actor_reports=reports)
    assert row == {
        "version": 4,
        "accuracy/train": pytest.approx(2 / 3),  # generated rewards 1, 0, 1
        "accuracy/train_groups_solved": 1.0,  # each group has a generated 1
        "throughput/samples_per_s": pytest.approx(4 / 3),  # 4 samples in 3 s
        "throughput/tokens_per_s": 6.0,  # 3 + 5 + 4 + 6 = 18 tokens in 3 s
        "response/length_mean": 4.0,  # generated lengths 3, 5, 4 (the demonstration's 6 is not one): 12 / 3
        "response/length_max": 5,
        "response/clipped_frac": pytest.approx(1 / 3),  # the 5-token response stopped at the limit ("length")
        "time/generate_wait_s": 0.5, "time/train_s": 2.0, "time/weight_sync_s": 0.25, "time/wall_s": 10.0,
        "weight_sync/gbps": 2.5, "weight_sync/refused": 0, "weight_sync/push_s": 0.8, "weight_sync/bytes": 1000,
        "weight_sync/changed_frac": 0.5,
        "buffer/dropped_stale": 3, "buffer/auth_refused": 1, "buffer/auth_refused_attempts": 9,
        "buffer/occupancy_groups": 7, "buffer/filtered": 7, "buffer/generated_samples": 40,
        "buffer/generated_correct": 11, "actors/restarts": 1, "buffer/restarts": 2, "reward/errors": 5, "reward/timeouts": 1,
        "actors/groups_no_version": 2,
        "actors/mixed_version_share": pytest.approx(0.075),  # 30 mixed of 300 + 100 acknowledged tokens
        "actors/seqs_in_flight": 40.0,  # (60 + 20) / 2 engines
        "actors/seq_capacity": 200.0,  # the one engine that knows its capacity
        "actors/engine_occupancy": 0.3,  # 60 in flight / 200 held, over the engines whose capacity is known
        "actors/requests_aborted": 5, "actors/members_regenerated": 4, "actors/groups_requeued": 1,  # one actor's
    }


def test_a_step_without_a_settled_push_or_generated_samples():
    row = step_row([_group(_sample(1.0, "demo", 2))], StepTimes(0.0, 1.0, 0.0, since_last_s=2.0, wall_s=2.0), {}, {},
                   version=1, actor_restarts=0, buffer_restarts=0, actor_reports=[])
    assert row["accuracy/train"] is None and row["throughput/tokens_per_s"] == 1.0
    assert row["accuracy/train_groups_solved"] is None  # no group has a generated row
    assert (row["weight_sync/gbps"], row["weight_sync/push_s"], row["weight_sync/refused"]) == (None, None, 0)
    assert (row["buffer/filtered"], row["reward/errors"]) == (0, 0)
    assert (row["response/length_mean"], row["response/length_max"], row["response/clipped_frac"]) == (None,) * 3
    assert (row["actors/seqs_in_flight"], row["actors/seq_capacity"], row["actors/engine_occupancy"]) == (None,) * 3


def test_a_group_is_solved_by_its_own_rows_only():
    groups = [_group(_sample(0.0, "stop", 1), _sample(0.0, "stop", 1)),  # none right
              _group(_sample(0.0, "stop", 1), _sample(1.0, "length", 1)),  # one right: solved
              _group(_sample(0.0, "stop", 1), _sample(1.0, "demo", 1)),  # only the demonstration is right
              _group(_sample(1.0, "demo", 1))]  # no generated row: left out
    row = step_row(groups, StepTimes(0.0, 1.0, 0.0, since_last_s=1.0, wall_s=1.0), {}, {}, version=1,
                   actor_restarts=0, buffer_restarts=0, actor_reports=[])
    assert row["accuracy/train_groups_solved"] == pytest.approx(1 / 3)  # 1 of the 3 groups with generated rows


def test_merging_refuses_a_key_two_writers_write():
    assert merge_rows(learner={"loss/total": 1.0}, driver={"version": 2}, evaluation={}) == \
        {"loss/total": 1.0, "version": 2}
    with pytest.raises(ValueError, match="'time/train_s' is written by both learner and driver"):
        merge_rows(learner={"time/train_s": 0.1, "loss/total": 1.0}, driver={"time/train_s": 0.3})
