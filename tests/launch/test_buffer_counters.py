"""The buffer counters the run writes are monotonic across buffer restarts: the restarted buffer goes on
from its snapshot's counts (17 stale drops) while the dead one had counted 22, and the metrics row keeps
22 and counts on from there (`BufferKeeper.monotonic`). `buffer/auth_refused` counts refused peers,
`buffer/auth_refused_attempts` every refused handshake."""

from types import SimpleNamespace

from launch.loop.metrics import StepTimes, step_row
from launch.state.buffer_keeper import BufferKeeper


def stats(stale: int, filtered: dict, refused: int, peers: int) -> dict:
    # generated_samples: 10 per stale drop in these made-up stats, so it must carry over restarts as they do
    return {"dropped_stale": stale, "generated_samples": 10 * stale, "filtered": filtered, "auth": {"curve": True, "refused": refused,
                                                                  "refused_peers": peers}}


def row(keeper: BufferKeeper, s: dict) -> dict:
    r = step_row([], StepTimes(0, 0, 0, since_last_s=1, wall_s=1), {}, keeper.monotonic(s), version=1,
                 actor_restarts=0, buffer_restarts=keeper.restarts, actor_reports=[])
    assert r["buffer/generated_samples"] == 10 * r["buffer/dropped_stale"]
    return {k: r[k] for k in ("buffer/dropped_stale", "buffer/filtered", "buffer/auth_refused",
                              "buffer/auth_refused_attempts")}


def test_counters_stay_monotonic_across_a_buffer_restart(tmp_path, monkeypatch):
    keeper = BufferKeeper(SimpleNamespace(buffer=SimpleNamespace(snapshot_every_s=60)), tmp_path)
    keeper.latest = (tmp_path / "snapshot.msgpack", 0.0)
    snapshot_counts = {"dropped_stale": 17, "generated_samples": 170, "filtered/all_same": 5, "auth/refused_key": 3}

    def start(restore=None):  # the new process restores the snapshot's counters
        keeper.proc = SimpleNamespace(restored={"version": 3, "groups": 0, "excluded": 0, "demos": 0,
                                                "counts": snapshot_counts}, join=lambda timeout: None)

    monkeypatch.setattr(keeper, "start", start)
    assert row(keeper, stats(22, {"all_same": 7}, 40, 1)) == {
        "buffer/dropped_stale": 22, "buffer/filtered": 7, "buffer/auth_refused": 1, "buffer/auth_refused_attempts": 40}
    keeper.restart(trained=[])
    # the new buffer: snapshot counts (17 stale, 5 filtered), handshake counters from 0
    assert row(keeper, stats(17, {"all_same": 5}, 0, 0)) == {
        "buffer/dropped_stale": 22, "buffer/filtered": 7, "buffer/auth_refused": 1, "buffer/auth_refused_attempts": 40}
    assert row(keeper, stats(18, {"all_same": 5, "acc": 2}, 5, 1)) == {
        "buffer/dropped_stale": 23, "buffer/filtered": 9, "buffer/auth_refused": 2, "buffer/auth_refused_attempts": 45}
    keeper.restart(trained=[])  # a second restart from the same snapshot
    assert row(keeper, stats(17, {"all_same": 5}, 0, 0))["buffer/dropped_stale"] == 23
    assert row(keeper, stats(17, {"all_same": 5}, 0, 0))["buffer/filtered"] == 9  # 'acc' carried
