"""A buffer process that dies is restarted by the driver (`launch.state.buffer_keeper`): at the same address,
from its latest snapshot minus what was trained since, with the prompts it lost re-queued to their
actors. Real buffer processes, killed with SIGKILL; the process graph is the stand-in of
`test_actor_recovery` (the whole thing, with Ray and vLLM, is `tests/e2e/test_fleet_e2e.py`)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from buffer.client import BufferClient
from configs.schema import RunConfig
from launch.loop.driver import Driver
from launch.state.buffer_keeper import BufferKeeper, lost_prompts
from launch.state.run_checkpoints import SNAPSHOT
from tests.buffer.helpers import make_group
from tests.launch.test_actor_recovery import StandInGraph


def test_lost_prompts_are_delivered_minus_trained_minus_held_once_each_in_order():
    delivered = [(0, 1), (0, 2), (0, 3), (0, 2), (1, 4)]
    trained = {(0, 1): 3}  # the ledger: key -> step
    held = [[0, 3]]  # as the buffer's stats list them
    # (0, 1) trained, (0, 3) held by the new buffer, (0, 2) delivered twice is re-queued once
    assert lost_prompts(delivered, trained, held) == [(0, 2), (1, 4)]
    assert lost_prompts([], trained, held) == []


def _push(client: BufferClient, prompt: int) -> None:
    assert client.push_group(make_group(f"g{prompt}", prompt_index=prompt, meta={"epoch": 0})).accepted


def test_a_killed_buffer_restarts_from_its_snapshot_without_what_was_trained_and_its_losses_requeued(tmp_path):
    cfg = RunConfig(buffer={"max_staleness": 1, "snapshot_every_s": 0.01}, learner={"batch_prompts": 2})
    keeper = BufferKeeper(cfg, tmp_path)
    address = keeper.start()
    graph, said = StandInGraph(address), []
    driver = Driver(cfg, graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, address,
                    SimpleNamespace(message=said.append), keeper=keeper)
    actor = BufferClient(address, "actor-0", timeout_s=5.0)
    try:
        for p in (1, 2, 3):
            _push(actor, p)
        time.sleep(0.02)
        assert driver.recovery.call_on_live_buffer(keeper.maybe_snapshot)  # holds prompts 1, 2, 3
        snap = tmp_path / "buffer" / "snapshot.msgpack"
        assert keeper.latest[0] == snap
        since = keeper.latest[1]
        batch = driver._pull()[0]  # FIFO: 1 and 2, trained at step 0
        driver.position.ledger.record(0, [(0, g.prompt_index) for g in batch])
        _push(actor, 4)  # acknowledged after the snapshot: only the dead buffer will have had it
        graph.delivered = {0: [(since - 5, (0, 1)), (since + 1, (0, 4))], 1: []}
        driver.position.step = 1  # = version 1
        driver.write_processes()
        assert json.loads((tmp_path / "processes.json").read_text())["buffer"]["pid"] == keeper.pid

        old_pid = keeper.pid
        os.kill(old_pid, signal.SIGKILL)
        keeper.proc.join(10)
        # the next buffer call finds the death before its request goes out (a request to the dead process
        # would wait out the client's send timeout): the call reaches the restarted buffer only
        alive_when_called = []
        assert driver.recovery.call_on_live_buffer(lambda c: alive_when_called.append(keeper.death()) or c.stats()["version"]) >= 0
        assert alive_when_called == [None]

        assert keeper.restarts == 1 and keeper.pid != old_pid and keeper.address == address
        assert not driver.recovery.restart_dead_buffer()  # alive: nothing to do
        assert driver.client.stats()["held_prompts"] == [[0, 3]]  # the snapshot, minus prompts 1 and 2 trained
        # (0, 1) was delivered before the snapshot; (0, 4) after it, and only the dead buffer had it
        assert graph.calls[-2:] == [("delivered_since", since), ("requeue", {0: [(0, 4)], 1: []})]
        assert [m for m in said if m.startswith("[buffer]")] == [said[-1]]  # one line says it all
        assert re.fullmatch(rf"\[buffer\] the buffer process \(pid {old_pid} on {re.escape(socket.gethostname())}; "
                            rf"log {tmp_path}/logs/buffer\.log\) died \(exit code -9\); restarted as pid {keeper.pid} "
                            rf"in \d+s: 1 groups restored from {snap} \(2 trained since then left out\); 1 prompts it "
                            r"had lost re-queued", said[-1]), said[-1]
        assert json.loads((tmp_path / "processes.json").read_text())["buffer"]["pid"] == keeper.pid

        _push(actor, 5)  # the actor's own client reconnects to the new process by itself
        assert [g.prompt_index for g in driver._pull()[0]] == [3, 5]
        assert driver.client.stats()["version"] == 1

        # killed again, just before a checkpoint: its snapshot is taken from the restarted buffer (found by
        # bench/chaos/chaos.py's reading of the code: the checkpoint called the buffer without this)
        os.kill(keeper.pid, signal.SIGKILL)
        keeper.proc.join(10)
        graph.save = lambda path, extra: (path / "extra_state.json").write_text(json.dumps(extra))
        ckpt = driver.checkpoints.save()
        assert keeper.restarts == 2 and (ckpt / SNAPSHOT).is_file()
    finally:
        actor.close()
        driver.client.close()
        keeper.stop()


def test_a_connection_lost_before_the_killed_buffer_can_be_reaped_still_restarts_it():
    """The race seen in the actor-restart e2e: SIGKILL closes the buffer's socket a moment before its exit is
    visible, so the driver's pull fails with "connection lost" while the process still counts as alive."""
    from buffer.client import BufferUnavailable
    from launch.state.recovery import Recovery

    class Keeper:  # the process closed its socket; its exit shows a few polls later
        polls = 0

        def death(self):
            self.polls += 1
            return "exit code -9" if self.polls > 3 else None

    recovery = object.__new__(Recovery)
    recovery.keeper, recovery.client = Keeper(), "old"
    restarted = []

    def restart_dead_buffer():
        if recovery.keeper.death() is None:
            return False
        restarted.append(recovery.client)
        recovery.client = "new"
        return True

    def pull(client):
        if client == "old":
            raise BufferUnavailable("buffer at tcp://127.0.0.1:1: connection lost while waiting for 'pull'")
        return "pulled"

    recovery.restart_dead_buffer = restart_dead_buffer
    assert recovery.call_on_live_buffer(pull) == "pulled" and restarted == ["old"]


def test_a_buffer_that_cannot_be_restarted_stops_the_run_with_one_line():
    from launch.processes.process_graph import RoleLost
    from launch.state.recovery import Recovery

    class Keeper:  # dead, and its successor fails to start (e.g. another process took its port meanwhile)
        pid, log_path = 4242, Path("run/logs/buffer.log")

        def death(self):
            return "exit code -9"

        def restart(self, trained):
            raise RuntimeError("the restarted buffer serves at tcp://127.0.0.1:2, not at tcp://127.0.0.1:1\nmore")

    recovery = object.__new__(Recovery)
    recovery.keeper, recovery.position = Keeper(), SimpleNamespace(ledger=SimpleNamespace(trained=[]))
    with pytest.raises(RoleLost) as e:
        recovery.restart_dead_buffer()
    assert str(e.value) == (f"[buffer] the buffer process (pid 4242 on {socket.gethostname()}; log run/logs/buffer.log) "
                            "died (exit code -9); starting a new one failed (RuntimeError: the restarted buffer serves "
                            "at tcp://127.0.0.1:2, not at tcp://127.0.0.1:1); the run stopped")
