"""Demonstrations are scored by the run's reward at load, and their rows carry that score into the buffer.

A teacher file with one wrong trace: the wrong trace's reward is 0 in `RunData`, the driver hands the
scores to the buffer with the demonstrations, and the rho = 1 row the buffer attaches to that prompt's
group has reward 0 (the right traces' rows keep 1)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from buffer.client import BufferClient
from buffer.process import start_buffer_process
from configs.schema import RunConfig
from launch.loop.driver import Driver
from launch.prep.data import arithmetic_config, load_run_data
from tasks import demonstration_records, make_splits, write_records
from tasks.arithmetic import Fault, solve
from tasks.tiny_model import build_tokenizer
from tests.buffer.helpers import make_group

WRONG = 2  # prompt_index of the wrong teacher trace


@pytest.fixture
def run_data(tmp_path):
    cfg = RunConfig()
    cfg.data.train_prompts, cfg.data.eval_prompts = 5, 2
    train, _ = make_splits(5, 2, seed=cfg.data.seed, config=arithmetic_config(cfg))
    records = demonstration_records(train, error_rate=0.0)
    # a user's teacher file whose trace for prompt 2 slips one digit in its first step (a fault always
    # changes the final answer, `tasks.arithmetic`)
    records[WRONG].target = "\n\n".join(solve(train[WRONG], Fault(0, "digit")))
    cfg.data.demos = str(write_records(tmp_path / "teacher.jsonl", records))
    said: list[str] = []
    data = load_run_data(cfg, build_tokenizer(), tmp_path, need_demos=True, log=said.append)
    return data, said


def test_a_wrong_teacher_trace_scores_zero_at_load(run_data):
    data, said = run_data
    assert data.demo_rewards == {0: 1.0, 1: 1.0, WRONG: 0.0, 3: 1.0, 4: 1.0}
    assert data.demos_below_one == 1
    assert said[0].startswith("[data] ") and ": 5 rows, layout veRL (" in said[0]  # the teacher file's layout
    assert said[1].endswith(": 5 of 5 training prompts have a demonstration (100%; the others are not trained); "
                            "0 of 5 teacher rows match no prompt")
    assert len(said) == 3 and said[2].startswith("[data] 1 of 5 demonstrations from ")
    assert "score < 1" in said[2]
    # each training prompt carries its demonstration to the actor (no request per guided prompt)
    assert [list(it.demo_ids) for it in data.train] == [data.demos[it.prompt_index].tolist() for it in data.train]
    assert len(data.train) == 5 and data.train[0].demo_ids[-1] == build_tokenizer().eos_token_id


def test_the_buffer_attaches_the_wrong_trace_with_its_score(run_data, tmp_path):
    data, _ = run_data
    proc, address = start_buffer_process(None, batch_prompts=2, max_staleness=1)
    driver = None
    try:
        driver = Driver(RunConfig(), SimpleNamespace(), data, tmp_path, address, SimpleNamespace(message=print))
        with BufferClient(address, "actor") as actor, BufferClient(address, "learner") as learner:
            for i in (WRONG, 0):  # rewards [0, 1, 0, 1] of the generated rows, plus one rho = 1 row
                assert actor.push_group(make_group(f"g{i}", prompt_index=i, meta={"demo_rows": 1})).accepted
            groups = {g.prompt_index: g for g in learner.pull_batch(2, timeout_s=10)}
        for i, want in ((WRONG, 0.0), (0, 1.0)):
            demo_row = groups[i].samples[-1]
            assert demo_row.finish_reason == "demo"
            assert demo_row.tokens.tolist() == data.demos[i].tolist()
            assert demo_row.reward == want
    finally:
        if driver is not None:
            driver.client.close()
        proc.terminate()
        proc.join(10)
