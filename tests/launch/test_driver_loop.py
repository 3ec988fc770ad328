"""The driver's loop end to end without Ray or vLLM: a real buffer process, a learner stand-in that
answers with metrics, no actors. Rows merge the learner's and the driver's keys (one writer each: a
learner key the driver also writes stops the run), then the final checkpoint and summary.json."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from buffer.client import BufferClient
from buffer.process import start_buffer_process
from configs.schema import RunConfig
from launch.loop.driver import Driver
from learner import checkpoint
from tests.buffer.helpers import make_group


class LearnerOnlyGraph:
    """`launch.processes.process_graph.ProcessGraph` with learner ranks that answer `metrics` and no actors."""

    actors, restarts, model_dir = [], 0, "unused"

    def __init__(self, metrics: dict):
        self.metrics, self.steps = metrics, []

    def step(self, groups, version):
        self.steps.append((len(groups), version))
        return dict(self.metrics)

    def save(self, path, extra_state):
        (path / "extra_state.json").write_text(json.dumps(extra_state))

    def start_rollouts(self, which=None):
        pass


@pytest.fixture
def run(tmp_path, monkeypatch):
    """run(learner_metrics) -> (status, graph, said) of a 2-step run over 4 groups in the buffer."""
    monkeypatch.setattr(checkpoint, "export_hf", lambda ckpt, out: out.mkdir(parents=True))
    proc, address = start_buffer_process(None, batch_prompts=2, max_staleness=1)
    with BufferClient(address, "actor-0") as actor:
        for i in range(4):
            assert actor.push_group(make_group(f"g{i}", prompt_index=i, meta={"epoch": 0})).accepted
    said: list[str] = []
    progress = SimpleNamespace(message=said.append, update=lambda *a, **k: None, close=lambda: None,
                               elapsed=lambda: 1.0, training_s=lambda: 1.0)

    def go(learner_metrics: dict, buffer: dict | None = None):
        cfg = RunConfig(learner={"steps": 2, "batch_prompts": 2, "eval_every": 0, "save_every": 0, "hf_every": 0},
                        logging={"tensorboard": False, "samples_every": 0}, buffer=buffer or {})
        graph = LearnerOnlyGraph(learner_metrics)
        driver = Driver(cfg, graph, SimpleNamespace(demos={}, eval=[], train=[]), tmp_path, address, progress)
        try:
            return driver.run(), graph, said
        finally:
            driver.client.close()

    yield go
    proc.terminate()
    proc.join(10)


def test_two_steps_write_rows_of_both_writers_a_checkpoint_and_the_summary(run, tmp_path):
    status, graph, said = run({"loss/total": 0.25, "time/learner_compute_s": 0.5})
    assert status == 0 and graph.steps == [(2, 0), (2, 1)]  # the learner gets the version before its step
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["version"]) for r in rows] == [(1, 1), (2, 2)]
    assert [r["buffer/occupancy_groups"] for r in rows] == [2, 0]
    assert [r["buffer/max_staleness"] for r in rows] == [1, 1]  # the bound the buffer enforces
    assert all(r["loss/total"] == 0.25 and r["time/learner_compute_s"] == 0.5 and r["time/train_s"] >= 0 for r in rows)
    assert json.loads((tmp_path / "checkpoints" / "step_2" / "extra_state.json").read_text())["step"] == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["step"], summary["stopped_early"], summary["version"]) == (2, False, 2)
    assert said[-1].startswith("[done] 2 steps")


def test_a_learner_key_the_driver_writes_stops_the_run(run):
    with pytest.raises(ValueError, match="'time/train_s' is written by both learner and driver"):
        run({"loss/total": 0.25, "time/train_s": 0.5})


def test_max_staleness_auto_sends_the_chosen_bound_with_set_version(run, tmp_path, monkeypatch):
    """The wiring of `launch.loop.staleness_auto`: each step's wait and busy time go to the chooser, its line to
    the console, its bound to the buffer with the next set_version, and the buffer's bound into the row."""
    seen = []

    class Chooser:  # decides K = 2 after the first step
        def __init__(self, k, cap):
            self.k, self.cap = k, cap

        def observe(self, step, wait_s, busy_s):
            seen.append((step, wait_s >= 0, busy_s >= 0))
            self.k = 2
            return "[staleness] auto: K=2" if step == 1 else None

        def restart(self):
            raise AssertionError("no evaluation in this run")

    monkeypatch.setattr("launch.loop.driver.AutoStaleness", Chooser)
    status, _, said = run({"loss/total": 0.25}, buffer={"max_staleness": "auto", "max_staleness_cap": 3})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert status == 0 and seen == [(1, True, True), (2, True, True)]
    assert [r["buffer/max_staleness"] for r in rows] == [1, 2] and said.count("[staleness] auto: K=2") == 1
