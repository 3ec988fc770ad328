"""bench/chaos/chaos.py's pure parts: the shard re-walk, the lost/twice audit on small hand-made ledgers, and the
restart lines it counts (no run: the chaos run itself is bench/chaos/chaos.py; its fault kinds and per-fault table are
tested in test_chaos_faults.py)."""

from __future__ import annotations

from actors.prompts import PromptCursor, PromptItem, shard
from bench.chaos.chaos_audit import audit, shard_walks
from bench.chaos.chaos_console import restarts

PROMPTS = [0, 1, 2, 3, 4, 5, 6, 8, 9, 10]  # prompt 7 skipped as over-long: shards are by position, not index


def test_the_re_walk_is_the_order_the_actors_hand_prompts_out():
    walks = shard_walks(PROMPTS, actors=2, seed=3, epochs=2)
    items = [PromptItem(i, (1,), "0") for i in PROMPTS]
    for a, walk in enumerate(walks):
        cursor = PromptCursor(shard(items, a, 2), seed=3, actor_id=a)
        assert walk == [(e, it.prompt_index) for it, e in (cursor.next_keyed() for _ in range(10))]
    assert sorted(i for _, i in walks[1][:5]) == [1, 3, 5, 8, 10]  # actor 1: positions 1, 3, 5, 7, 9


def test_a_clean_run_has_nothing_lost_or_twice():
    walks = [[(0, 0), (0, 2), (0, 4), (0, 6)], [(0, 1), (0, 3), (0, 5), (0, 7)]]
    # shard 0: 3 settled (trained, discarded, held), the 4th not started; shard 1: trained up to (0, 5)
    a = audit(walks, trained=[(0, 0), (0, 1), (0, 3), (0, 5)], discarded=[(0, 2)], held=[(0, 4)])
    assert (a.lost, a.twice, a.trained_and_held, a.foreign) == ([], [], [], [])
    assert (a.trained, a.discarded, a.held, a.frontiers) == (4, 1, 1, [3, 3])


def test_lost_is_a_gap_before_the_frontier_and_twice_a_repeated_key():
    walks = [[(0, 0), (0, 2), (0, 4), (0, 6), (1, 2), (1, 0)], [(0, 1), (0, 3), (0, 5), (0, 7)]]
    # shard 0: (0, 2) and (0, 6) never settled although (1, 2) of the next epoch was trained; shard 1:
    # (0, 3) trained twice, (0, 1) trained and still held, (0, 9) in nobody's walk; the tail of shard 1
    # ((0, 7)) is past its frontier: not started, not lost
    a = audit(walks, trained=[(0, 0), (0, 4), (1, 2), (0, 1), (0, 3), (0, 3), (0, 5), (0, 9)],
              discarded=[], held=[(0, 1)])
    assert a.lost == [(0, 2), (0, 6)]
    assert a.twice == [(0, 3)]
    assert a.trained_and_held == [(0, 1)]
    assert a.foreign == [(0, 9)]
    assert a.frontiers == [5, 3] and a.trained == 8


def test_restarts_are_read_from_the_runs_own_lines():
    console = "\n".join([
        "[actor] actor 0 (pid 10557 on node1; log runs/a/logs/actor-0.log) died (process gone: ActorDiedError); "
        "restarted as pid 12062 and re-synced to version 2 in 51s; its shard resumes past the 40 prompts trained",
        "[buffer] the buffer process (pid 4242 on node1; log runs/x/logs/buffer.log) died (exit code -9); restarted "
        "as pid 4311 in 1s: 6 groups restored from runs/x/buffer/snapshot.msgpack",
        "[learner] learner rank 0 (pid 777 on node1; log runs/a/logs/learner-0.log) died (process gone: "
        "ActorDiedError); restart 1 of 5: resuming runs/a from step 30",
        "[learner] restart 2 of 5: resuming runs/a from step 40",
        "12:00:01 step 3/60 | 10.0 samples/s",
        "[actor] actor 1 (pid 99 on node1; log l) died (x); the run stopped",  # no restart: not counted
    ])
    assert restarts(console) == {"actor": [10557], "buffer": [4242], "learner": [777, 0]}
